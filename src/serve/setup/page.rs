//! The setup pages, rendered on the server with maud (the run page reuses [`layout`]):
//! no external assets, a few lines of CSS, readable on a phone.

use maud::{html, Markup, PreEscaped, DOCTYPE};

/// One line of the checks shown after setup: `ok`, `fail` or `note`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckLine {
    pub tag: &'static str,
    pub text: String,
}

const CSS: &str = "
*{box-sizing:border-box}
body{font:16px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
main{max-width:42rem;margin:0 auto;padding:1.25rem}
h1{font-size:1.5rem;margin:.5rem 0 1rem}
h2{font-size:1.1rem;margin:1.5rem 0 .5rem}
.card{background:#fff;border:1px solid #d9dee5;border-radius:10px;padding:1rem 1.1rem;margin:1rem 0}
.card.steer{border-left:4px solid #8250df;background:#faf7ff}
label{display:block;font-weight:600;margin:.8rem 0 .25rem}
input[type=text],input[type=url],input[type=number],textarea{width:100%;padding:.55rem .6rem;border:1px solid #b8c0cc;border-radius:6px;font:inherit}
textarea{min-height:7rem;font-family:ui-monospace,monospace;font-size:.85rem}
.choice{display:flex;gap:1rem;flex-wrap:wrap;font-weight:400}
.choice label{font-weight:400;margin:0}
button,.button{display:inline-block;margin-top:1rem;padding:.65rem 1.1rem;border:0;border-radius:6px;background:#1f6feb;color:#fff;font:inherit;font-weight:600;text-decoration:none;cursor:pointer}
.hint{color:#57606a;font-size:.9rem;margin:.2rem 0}
.error{background:#ffebe9;border-color:#ff8182}
ul.checks{list-style:none;padding:0;margin:0}
ul.checks li{padding:.3rem 0;border-bottom:1px solid #eef0f3;overflow-wrap:anywhere}
.tag{display:inline-block;min-width:3.2rem;font-family:ui-monospace,monospace;font-weight:700}
.ok{color:#1a7f37}.fail{color:#cf222e}.note{color:#57606a}
details summary{cursor:pointer;font-weight:600}
code{font-family:ui-monospace,monospace;font-size:.9em;overflow-wrap:anywhere}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f8fa;border-radius:6px;padding:.5rem .6rem;margin:.4rem 0;font:.85rem/1.4 ui-monospace,monospace}
pre.typed{background:#1d232b;color:#e6edf3}
pre.text{background:none;padding:0;font:inherit}
pre.fail{border-left:3px solid #cf222e}
";

/// The headers every HTML page of kodx is sent with: never stored by a cache or the
/// browser (pages carry tokens and private runs), never framed by another site, and
/// loading nothing from elsewhere; `csp` is the page's `Content-Security-Policy`.
pub fn page_headers(csp: &'static str) -> [(&'static str, &'static str); 3] {
    [
        ("cache-control", "no-store"),
        ("x-frame-options", "DENY"),
        ("content-security-policy", csp),
    ]
}

/// The page frame shared by kodx's pages.
pub fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · kodx" }
                style { (PreEscaped(CSS)) }
            }
            body { main { (body) } }
        }
    }
}

/// What the setup form shows.
pub struct SetupForm<'a> {
    pub token: &'a str,
    pub name: &'a str,
    pub public_url: &'a str,
    pub org: &'a str,
    pub github_url: &'a str,
    /// A problem with what was sent, shown above the form.
    pub error: Option<&'a str>,
}

/// `GET /`: create the App from a manifest, or import an existing one.
pub fn setup(form: &SetupForm<'_>) -> Markup {
    layout(
        "Set up kodx",
        html! {
            h1 { "Set up kodx" }
            p { "kodx has no GitHub App yet. Create one on GitHub with a click, or import an App you already have." }
            @if let Some(e) = form.error {
                div.card.error id="error" { (e) }
            }
            form.card method="post" action="/setup/create" id="create" {
                h2 { "Create a new GitHub App" }
                input type="hidden" name="token" value=(form.token);
                label for="name" { "App name" }
                input type="text" id="name" name="name" value=(form.name) maxlength="34" required;
                label { "Owner" }
                div.choice {
                    label { input type="radio" name="owner" value="personal" checked; " My account" }
                    label { input type="radio" name="owner" value="organization" id="owner-org"; " An organization" }
                }
                label for="org" { "Organization " span.hint { "(if an organization owns it)" } }
                input type="text" id="org" name="org" value=(form.org) placeholder="acme";
                label for="public_url" { "Public URL" }
                input type="url" id="public_url" name="public_url" value=(form.public_url) required;
                p.hint { "GitHub sends webhooks to this address + " code { "/webhook" } "." }
                button type="submit" id="create-app" { "Create the App on GitHub" }
                p.hint { "Goes to " code { (form.github_url) } ", which asks you to confirm, then comes back here." }
            }
            details.card {
                summary { "Import an existing App" }
                form method="post" action="/setup/import" id="import" {
                    input type="hidden" name="token" value=(form.token);
                    label for="app_id" { "App ID" }
                    input type="number" id="app_id" name="app_id" min="1" required;
                    label for="private_key" { "Private key (PEM)" }
                    textarea id="private_key" name="private_key" required placeholder="-----BEGIN RSA PRIVATE KEY-----" {}
                    label for="webhook_secret" { "Webhook secret" }
                    input type="text" id="webhook_secret" name="webhook_secret" required autocomplete="off";
                    button type="submit" { "Import" }
                }
            }
        },
    )
}

/// The step between the form and GitHub: a form GitHub expects (the manifest in a hidden
/// field), sent at once by one line of script, or by its button without script.
pub fn to_github(action: &str, manifest: &str) -> Markup {
    layout(
        "Create the App on GitHub",
        html! {
            h1 { "Create the App on GitHub" }
            form.card id="manifest-form" method="post" action=(action) {
                input type="hidden" name="manifest" value=(manifest);
                p { "Sending the App's manifest to GitHub…" }
                button type="submit" id="to-github" { "Continue on GitHub" }
            }
            script { (PreEscaped("document.getElementById('manifest-form').submit();")) }
        },
    )
}

/// After setup: where the credentials came from, the checks, and the install link.
pub fn done(
    app_name: &str,
    install_url: Option<&str>,
    saved_to: &str,
    lines: &[CheckLine],
) -> Markup {
    layout(
        "kodx is set up",
        html! {
            h1 { "kodx is set up" }
            div.card {
                p { "The App " strong { (app_name) } " is ready. Its id, key and webhook secret are saved in " code { (saved_to) } " (mode 0600); kodx now takes webhooks, without a restart." }
                @if let Some(url) = install_url {
                    a.button href=(url) id="install" { "Install the App on your repositories" }
                }
            }
            h2 { "Checks" }
            ul.checks.card id="checks" {
                @for line in lines {
                    li {
                        span class=(format!("tag {}", line.tag)) { (line.tag) }
                        " " (line.text)
                    }
                }
            }
        },
    )
}

/// A one-message page (an error, or setup already done).
pub fn message(title: &str, text: &str) -> Markup {
    layout(
        title,
        html! {
            h1 { (title) }
            div.card.error { (text) }
        },
    )
}
