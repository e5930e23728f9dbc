//! The fake GitHub's GraphQL endpoint, `POST /graphql`, checked as GitHub checks it. Each
//! document is parsed and validated against GitHub's public schema
//! (`tests/data/github-schema.graphql.gz`, see `tests/data/README.md`) by apollo-compiler,
//! and its `variables` coerced to the operation's variable types; a document or variables
//! GitHub would refuse get GitHub's answer (HTTP 200, `{"errors": [{"message",
//! "locations"}]}`) and are recorded in `refused()`. A valid document is executed by
//! apollo-compiler's executor against the fake's state: it answers exactly the fields asked
//! for, under their aliases, with arguments read from the document and the variables. The
//! resolvers below implement the fields kodx uses; a valid field they do not implement is a
//! field error recorded in `refused()`, so a new query fails loudly until the fake learns it.
//!
//! Implemented: `repository(owner, name) { pullRequest(number) { id number isDraft
//! reviewThreads(first|last, after, before) } }` with threads (`id isResolved isOutdated
//! isCollapsed path line originalLine startLine originalStartLine diffSide startDiffSide
//! subjectType viewerCanResolve viewerCanUnresolve viewerCanReply comments(...)`) and their
//! comments (`id databaseId fullDatabaseId author { login url } body createdAt diffHunk url
//! path`); connections' `totalCount pageInfo nodes` with GitHub's paging rules (one of
//! `first`/`last`, at most 100, opaque cursors honoured); the mutations
//! `markPullRequestReadyForReview`, `addPullRequestReviewThreadReply`, `resolveReviewThread`.
//! Node ids: `PR_<number>`, `PRRT_<n>` (threads), `PRRC_<n>` (comments); an unknown one is
//! GitHub's `NOT_FOUND`. Reading needs the token's repository and `pull_requests: read`,
//! the mutations `pull_requests: write` (else `FORBIDDEN` "Resource not accessible by
//! integration", recorded in `forbidden()`), and resolving a thread added with
//! `can_resolve: false` is `FORBIDDEN` too. A comment author `ghost` is served as `null`
//! (a deleted account).
//!
//! Test API (on `FakeGitHub`): `add_review_thread(repo, pull, FakeThread) -> node id`,
//! `thread(id) -> FakeThreadState { resolved, replies }`, `graphql_calls()` (each GraphQL
//! request's operation name, else its first field), `rate_limit_graphql_once()` (the next
//! GraphQL request gets GitHub's `RATE_LIMITED` answer, HTTP 200 with `x-ratelimit-*`
//! headers resetting in a second).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use apollo_compiler::executable::Operation;
use apollo_compiler::request::coerce_variable_values;
use apollo_compiler::resolvers::{Execution, FieldError, ObjectValue, ResolveInfo, ResolvedValue};
use apollo_compiler::response::{ExecutionResponse, GraphQLError, JsonMap, JsonValue};
use apollo_compiler::validation::Valid;
use apollo_compiler::{ExecutableDocument, Schema};
use axum::extract::State;
use axum::response::Response;
use base64::Engine as _;
use serde_json::{json, Value};

use super::{
    auth_installation, credential, iso8601, json_response, now_secs, token_installation,
    FakeGitHub, Need, Req, METADATA, PULLS_READ, PULLS_WRITE,
};

const SCHEMA_GZ: &[u8] = include_bytes!("../../data/github-schema.graphql.gz");
/// Separates GitHub's error `type` from the message in a resolver's [`FieldError`] (which
/// has a message only); [`respond`] turns it into the `type` field.
const TYPE_MARK: char = '\u{1f}';
const MAX_BODY_CHARS: usize = 65_536;
const NOT_ACCESSIBLE: &str = "Resource not accessible by integration";

/// A review thread to add: where it is, its state, and its comments in order, each
/// `(author login, is a bot, body)`. `Default` is an open thread the token may resolve.
#[derive(Clone, Debug)]
pub struct FakeThread {
    pub path: String,
    pub line: Option<i64>,
    pub original_line: Option<i64>,
    pub outdated: bool,
    pub resolved: bool,
    /// `viewerCanResolve`: resolving is `FORBIDDEN` when false.
    pub can_resolve: bool,
    pub diff_hunk: String,
    pub comments: Vec<(String, bool, String)>,
}

impl Default for FakeThread {
    fn default() -> FakeThread {
        FakeThread {
            path: "src/lib.rs".into(),
            line: Some(1),
            original_line: Some(1),
            outdated: false,
            resolved: false,
            can_resolve: true,
            diff_hunk: "@@ -1 +1 @@\n-old\n+new".into(),
            comments: Vec::new(),
        }
    }
}

/// A thread as it is now: resolved or not, and the bodies of the replies posted through
/// `addPullRequestReviewThreadReply`, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeThreadState {
    pub resolved: bool,
    pub replies: Vec<String>,
}

/// The GraphQL side of the fake's state (a field of its state).
#[derive(Default)]
pub(super) struct GraphqlState {
    /// By the `n` of `PRRT_<n>`; ascending `n` is creation order.
    threads: BTreeMap<u64, Thread>,
    calls: Vec<String>,
    rate_limit_once: bool,
}

#[derive(Clone)]
struct Thread {
    /// Lower-case `owner/name`.
    repo: String,
    full_name: String,
    pull: u64,
    spec: FakeThread,
    /// The comments, the given ones then the replies; `spec.comments` is left empty.
    comments: Vec<ThreadComment>,
    replies: Vec<String>,
}

#[derive(Clone)]
struct ThreadComment {
    /// Ascending in creation order.
    id: u64,
    /// `None`: a deleted account (`ghost`).
    author: Option<String>,
    is_bot: bool,
    body: String,
    created_at: String,
}

impl FakeGitHub {
    /// Adds a review thread to pull request `pull` of `repo`; returns its node id
    /// (`PRRT_<n>`).
    pub fn add_review_thread(&self, repo: &str, pull: u64, mut spec: FakeThread) -> String {
        let mut st = self.state();
        let key = repo.to_lowercase();
        let full_name = st
            .repos
            .get(&key)
            .filter(|r| r.issues.get(&pull).is_some_and(|i| i.pull.is_some()))
            .map(|r| r.full_name.clone())
            .unwrap_or_else(|| panic!("add_pull({repo}, {pull}) first"));
        let n = st.next_id();
        let created_at = iso8601(SystemTime::now());
        let comments = std::mem::take(&mut spec.comments)
            .into_iter()
            .map(|(login, is_bot, body)| ThreadComment {
                id: st.next_id(),
                author: (login != "ghost").then_some(login),
                is_bot,
                body,
                created_at: created_at.clone(),
            })
            .collect();
        let thread = Thread {
            repo: key,
            full_name,
            pull,
            spec,
            comments,
            replies: Vec::new(),
        };
        st.graphql.threads.insert(n, thread);
        format!("PRRT_{n}")
    }

    /// The state of the thread `id` (as `add_review_thread` returned it).
    pub fn thread(&self, id: &str) -> FakeThreadState {
        let st = self.state();
        let t = thread_number(id)
            .and_then(|n| st.graphql.threads.get(&n))
            .unwrap_or_else(|| panic!("no review thread {id}"));
        FakeThreadState {
            resolved: t.spec.resolved,
            replies: t.replies.clone(),
        }
    }

    /// Each GraphQL request that passed validation, in order: its operation name, else its
    /// first field.
    pub fn graphql_calls(&self) -> Vec<String> {
        self.state().graphql.calls.clone()
    }

    /// The next GraphQL request is answered with GitHub's primary rate limit error.
    pub fn rate_limit_graphql_once(&self) {
        self.state().graphql.rate_limit_once = true;
    }
}

fn thread_number(id: &str) -> Option<u64> {
    id.strip_prefix("PRRT_")?.parse().ok()
}

// -------------------------------------------------------------------------------------
// The endpoint
// -------------------------------------------------------------------------------------

/// GitHub's public schema, parsed and validated once per process. GitHub's published schema
/// defines two fields of `EnterpriseOwnerInfo` twice (the same way each time), which the
/// GraphQL spec forbids: those duplicates are dropped (the first definition is kept) and
/// any other problem fails the test run.
fn schema() -> &'static Valid<Schema> {
    static SCHEMA: OnceLock<Valid<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let mut sdl = String::new();
        flate2::read::GzDecoder::new(SCHEMA_GZ)
            .read_to_string(&mut sdl)
            .expect("tests/data/github-schema.graphql.gz is gzip of UTF-8");
        let schema = match Schema::parse(sdl, "github-schema.graphql") {
            Ok(schema) => schema,
            Err(with) => {
                let other: Vec<String> = with
                    .errors
                    .iter()
                    .map(|d| d.to_json().message)
                    .filter(|m| !m.starts_with("duplicate definitions for the `"))
                    .collect();
                assert!(other.is_empty(), "GitHub's schema: {other:?}");
                assert!(with.errors.len() <= 8, "{}", with.errors);
                with.partial
            }
        };
        schema.validate().expect("GitHub's schema validates")
    })
}

/// `POST /graphql`: an installation token, a JSON body `{query, variables?,
/// operationName?}`, then validation and execution (see the module's documentation).
pub(super) async fn graphql(State(fake): State<FakeGitHub>, req: Req) -> Response {
    let installation = match token_installation(&fake, &req) {
        Ok(i) => i,
        Err(r) => return r,
    };
    let body = match req.json_object(&fake) {
        Ok(b) => b,
        Err(r) => return r,
    };
    match run(&fake, &req, &body, installation) {
        Ok(r) | Err(r) => r,
    }
}

#[allow(clippy::result_large_err)]
fn run(
    fake: &FakeGitHub,
    req: &Req,
    body: &serde_json::Map<String, Value>,
    installation: u64,
) -> Result<Response, Response> {
    let (query, variables, operation_name) = request_parts(fake, req, body)?;
    let schema = schema();
    let doc = ExecutableDocument::parse_and_validate(schema, query, "query.graphql")
        .map_err(|e| invalid(fake, req, e.errors.iter().map(|d| d.to_json()).collect()))?;
    let operation = doc
        .operations
        .get(operation_name)
        .map_err(|e| invalid(fake, req, vec![e.to_graphql_error(&doc.sources)]))?;
    let variables = coerce_variable_values(schema, operation, &variables)
        .map_err(|e| invalid(fake, req, vec![e.to_graphql_error(&doc.sources)]))?;
    let limited = {
        let mut st = fake.state();
        st.graphql.calls.push(call_name(operation, &doc));
        std::mem::take(&mut st.graphql.rate_limit_once)
    };
    if limited {
        return Ok(rate_limited(installation));
    }
    let ctx = Ctx { fake, req };
    let root = Root {
        ctx: &ctx,
        mutation: operation.is_mutation(),
    };
    let response = Execution::new(schema, &doc)
        .operation(operation)
        .coerced_variable_values(&variables)
        .execute_sync(&root)
        .map_err(|e| invalid(fake, req, vec![e.to_graphql_error(&doc.sources)]))?;
    Ok(respond(response))
}

/// The query, the variables and the operation name of a request body, or GitHub's error.
#[allow(clippy::result_large_err)]
fn request_parts<'b>(
    fake: &FakeGitHub,
    req: &Req,
    body: &'b serde_json::Map<String, Value>,
) -> Result<(&'b str, JsonMap, Option<&'b str>), Response> {
    let error = |message: &str| invalid(fake, req, vec![plain_error(message)]);
    if let Some(k) = body
        .keys()
        .find(|k| !["query", "variables", "operationName"].contains(&k.as_str()))
    {
        return Err(error(&format!("unknown request key `{k}`")));
    }
    let Some(query) = body.get("query").and_then(Value::as_str) else {
        return Err(error(
            "A query attribute must be specified and must be a string.",
        ));
    };
    let variables = match body.get("variables") {
        None | Some(Value::Null) => JsonMap::new(),
        Some(v @ Value::Object(_)) => {
            serde_json::from_value(v.clone()).map_err(|e| error(&e.to_string()))?
        }
        Some(_) => return Err(error("Variables are invalid JSON.")),
    };
    let operation_name = match body.get("operationName") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(error("operationName must be a string")),
    };
    Ok((query, variables, operation_name))
}

fn plain_error(message: &str) -> GraphQLError {
    GraphQLError {
        message: message.to_string(),
        locations: Vec::new(),
        path: Vec::new(),
        extensions: JsonMap::new(),
    }
}

/// GitHub's answer to a request it will not run: HTTP 200 with `errors` only; recorded as
/// refused (kodx sent something GitHub rejects).
fn invalid(fake: &FakeGitHub, req: &Req, errors: Vec<GraphQLError>) -> Response {
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    fake.state().refused.push(format!(
        "{}: invalid GraphQL: {}",
        req.what(),
        messages.join("; ")
    ));
    json_response(200, json!({ "errors": errors }))
}

fn call_name(operation: &Operation, doc: &ExecutableDocument) -> String {
    match &operation.name {
        Some(name) => name.to_string(),
        None => operation
            .root_fields(doc)
            .next()
            .map(|f| f.name.to_string())
            .unwrap_or_default(),
    }
}

/// GitHub's primary GraphQL rate limit: HTTP 200, a `RATE_LIMITED` error, and the limit's
/// headers (resetting in a second).
fn rate_limited(installation: u64) -> Response {
    let mut resp = json_response(
        200,
        json!({ "errors": [{
            "type": "RATE_LIMITED",
            "code": "graphql_rate_limit",
            "message": format!("API rate limit already exceeded for installation ID {installation}."),
        }]}),
    );
    let h = resp.headers_mut();
    h.insert("x-ratelimit-limit", "5000".parse().unwrap());
    h.insert("x-ratelimit-remaining", "0".parse().unwrap());
    h.insert("x-ratelimit-used", "5000".parse().unwrap());
    h.insert(
        "x-ratelimit-reset",
        (now_secs() + 1).to_string().parse().unwrap(),
    );
    h.insert("x-ratelimit-resource", "graphql".parse().unwrap());
    resp
}

/// The executor's answer as GitHub words it: a resolver's message without the executor's
/// `resolver error: ` prefix, and GitHub's `type` put back on the errors that have one.
fn respond(response: ExecutionResponse) -> Response {
    let mut v = serde_json::to_value(&response).expect("a GraphQL response is JSON");
    for e in v
        .get_mut("errors")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let Some(message) = e["message"].as_str() else {
            continue;
        };
        let message = message.strip_prefix("resolver error: ").unwrap_or(message);
        let (kind, message) = match message.split_once(TYPE_MARK) {
            Some((kind, message)) => (Some(kind.to_string()), message.to_string()),
            None => (None, message.to_string()),
        };
        e["message"] = json!(message);
        if let Some(kind) = kind {
            e["type"] = json!(kind);
        }
    }
    json_response(200, v)
}

// -------------------------------------------------------------------------------------
// Resolvers
// -------------------------------------------------------------------------------------

/// A field error with GitHub's `type`.
fn typed(kind: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        message: format!("{kind}{TYPE_MARK}{}", message.into()),
    }
}

fn missing_node(id: &str) -> String {
    format!("Could not resolve to a node with the global id of '{id}'")
}

fn not_found(id: &str) -> FieldError {
    typed("NOT_FOUND", missing_node(id))
}

/// What every resolver sees: the fake and the request (its token).
struct Ctx<'a> {
    fake: &'a FakeGitHub,
    req: &'a Req,
}

impl Ctx<'_> {
    /// Something kodx should not send: recorded in `refused()`, answered as a field error
    /// (with GitHub's `type` when there is one).
    fn refuse(&self, kind: Option<&str>, message: String) -> FieldError {
        self.fake
            .state()
            .refused
            .push(format!("{}: {message}", self.req.what()));
        match kind {
            Some(kind) => typed(kind, message),
            None => FieldError { message },
        }
    }

    /// A field of the schema no resolver here implements.
    fn unimplemented(&self, type_name: &str, info: &ResolveInfo<'_>) -> FieldError {
        self.refuse(
            None,
            format!(
                "the fake GitHub does not implement `{type_name}.{}` (fake_github_graphql.rs)",
                info.field_name()
            ),
        )
    }

    /// The token's access to the repository `key` for `need`, checked as REST checks it;
    /// a refusal is GitHub's GraphQL `FORBIDDEN`, a repository it cannot see `NOT_FOUND`
    /// with `missing` as the message.
    fn auth(&self, key: &str, need: Need, missing: String) -> Result<(), FieldError> {
        let (owner, name) = key.split_once('/').unwrap_or((key, ""));
        match auth_installation(self.fake, self.req, owner, name, need) {
            Ok(_) => Ok(()),
            Err(r) if r.status() == 403 => Err(typed("FORBIDDEN", NOT_ACCESSIBLE)),
            Err(_) => Err(typed("NOT_FOUND", missing)),
        }
    }

    /// Whether the token may do `need` on the repository `key` (nothing recorded).
    fn may(&self, key: &str, need: Need) -> bool {
        let Some((_, token)) = credential(self.req) else {
            return false;
        };
        let st = self.fake.state();
        st.tokens
            .get(&token)
            .is_some_and(|t| t.covers(key) && t.grants(need))
    }

    /// The thread `id`, a snapshot of it now.
    fn thread(&self, id: &str) -> Result<(u64, Arc<Thread>), FieldError> {
        let n = thread_number(id).ok_or_else(|| not_found(id))?;
        let st = self.fake.state();
        let t = st.graphql.threads.get(&n).ok_or_else(|| not_found(id))?;
        Ok((n, Arc::new(t.clone())))
    }
}

/// The field's arguments, refusing any this fake does not implement.
fn args<'i>(
    ctx: &Ctx,
    info: &'i ResolveInfo<'i>,
    type_name: &str,
    known: &[&str],
) -> Result<&'i JsonMap, FieldError> {
    let a = info.arguments();
    fields_known(ctx, a, &format!("{type_name}.{}", info.field_name()), known)?;
    Ok(a)
}

/// A mutation's `input` object, refusing fields this fake does not implement.
fn input<'i>(
    ctx: &Ctx,
    info: &'i ResolveInfo<'i>,
    known: &[&str],
) -> Result<&'i JsonMap, FieldError> {
    let a = args(ctx, info, "Mutation", &["input"])?;
    let input = a
        .get("input")
        .and_then(JsonValue::as_object)
        .ok_or_else(|| FieldError {
            message: "no input".into(),
        })?;
    fields_known(ctx, input, &format!("{}(input:)", info.field_name()), known)?;
    Ok(input)
}

fn fields_known(ctx: &Ctx, map: &JsonMap, what: &str, known: &[&str]) -> Result<(), FieldError> {
    match map
        .iter()
        .find(|(k, v)| !v.is_null() && !known.contains(&k.as_str()))
    {
        Some((k, _)) => Err(ctx.refuse(
            None,
            format!(
                "the fake GitHub does not implement `{}` of `{what}`",
                k.as_str()
            ),
        )),
        None => Ok(()),
    }
}

fn text(map: &JsonMap, name: &str) -> String {
    map.get(name)
        .and_then(JsonValue::as_str)
        .unwrap_or_default()
        .to_string()
}

fn int<'b>(v: Option<i64>) -> ResolvedValue<'b> {
    v.map_or_else(ResolvedValue::null, ResolvedValue::leaf)
}

/// `Query` or `Mutation`.
struct Root<'a> {
    ctx: &'a Ctx<'a>,
    mutation: bool,
}

impl ObjectValue for Root<'_> {
    fn type_name(&self) -> &str {
        if self.mutation {
            "Mutation"
        } else {
            "Query"
        }
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        let ctx = self.ctx;
        match (self.mutation, info.field_name()) {
            (false, "repository") => repository(ctx, info),
            (true, "markPullRequestReadyForReview") => mark_ready(ctx, info),
            (true, "addPullRequestReviewThreadReply") => add_reply(ctx, info),
            (true, "resolveReviewThread") => resolve_thread(ctx, info),
            _ => Err(ctx.unimplemented(self.type_name(), info)),
        }
    }
}

fn repository<'b>(
    ctx: &'b Ctx<'b>,
    info: &'b ResolveInfo<'b>,
) -> Result<ResolvedValue<'b>, FieldError> {
    let a = args(ctx, info, "Query", &["owner", "name", "followRenames"])?;
    let (owner, name) = (text(a, "owner"), text(a, "name"));
    let key = format!("{owner}/{name}").to_lowercase();
    let missing = format!("Could not resolve to a Repository with the name '{owner}/{name}'.");
    ctx.auth(&key, METADATA, missing)?;
    Ok(ResolvedValue::object(RepositoryObj { ctx, key }))
}

struct RepositoryObj<'a> {
    ctx: &'a Ctx<'a>,
    key: String,
}

impl ObjectValue for RepositoryObj<'_> {
    fn type_name(&self) -> &str {
        "Repository"
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        let ctx = self.ctx;
        if info.field_name() != "pullRequest" {
            return Err(ctx.unimplemented(self.type_name(), info));
        }
        let a = args(ctx, info, "Repository", &["number"])?;
        let number = a.get("number").and_then(JsonValue::as_i64).unwrap_or(0);
        let missing = format!("Could not resolve to a PullRequest with the number of {number}.");
        ctx.auth(&self.key, PULLS_READ, missing.clone())?;
        let number = u64::try_from(number).unwrap_or(0);
        let exists = ctx.fake.state().repos[&self.key]
            .issues
            .get(&number)
            .is_some_and(|i| i.pull.is_some());
        if !exists {
            return Err(typed("NOT_FOUND", missing));
        }
        Ok(ResolvedValue::object(PullRequestObj {
            ctx,
            key: self.key.clone(),
            number,
        }))
    }
}

#[derive(Clone)]
struct PullRequestObj<'a> {
    ctx: &'a Ctx<'a>,
    key: String,
    number: u64,
}

impl ObjectValue for PullRequestObj<'_> {
    fn type_name(&self) -> &str {
        "PullRequest"
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        match info.field_name() {
            "id" => Ok(ResolvedValue::leaf(format!("PR_{}", self.number))),
            "number" => Ok(ResolvedValue::leaf(self.number as i64)),
            "isDraft" => {
                let st = self.ctx.fake.state();
                let issue = &st.repos[&self.key].issues[&self.number];
                Ok(ResolvedValue::leaf(
                    issue.pull.as_ref().is_some_and(|p| p.draft),
                ))
            }
            "reviewThreads" => self.review_threads(info),
            _ => Err(self.ctx.unimplemented(self.type_name(), info)),
        }
    }
}

impl<'a> PullRequestObj<'a> {
    fn review_threads<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        let ctx = self.ctx;
        let a = args(
            ctx,
            info,
            "PullRequest",
            &["first", "last", "after", "before"],
        )?;
        let threads: Vec<(u64, Arc<Thread>)> = {
            let st = ctx.fake.state();
            st.graphql
                .threads
                .iter()
                .filter(|(_, t)| t.repo == self.key && t.pull == self.number)
                .map(|(n, t)| (*n, Arc::new(t.clone())))
                .collect()
        };
        let ids: Vec<u64> = threads.iter().map(|(n, _)| *n).collect();
        let (range, page) = paginate(ctx, a, "reviewThreads", &ids)?;
        let nodes = threads[range]
            .iter()
            .map(|(n, thread)| ThreadObj {
                ctx,
                n: *n,
                thread: thread.clone(),
            })
            .collect();
        Ok(ResolvedValue::object(Connection {
            ctx,
            type_name: "PullRequestReviewThreadConnection",
            total: ids.len(),
            page,
            nodes,
        }))
    }
}

#[derive(Clone)]
struct ThreadObj<'a> {
    ctx: &'a Ctx<'a>,
    n: u64,
    thread: Arc<Thread>,
}

impl ObjectValue for ThreadObj<'_> {
    fn type_name(&self) -> &str {
        "PullRequestReviewThread"
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        let t = &self.thread;
        let s = &t.spec;
        Ok(match info.field_name() {
            "id" => ResolvedValue::leaf(format!("PRRT_{}", self.n)),
            "isResolved" => ResolvedValue::leaf(s.resolved),
            "isCollapsed" => ResolvedValue::leaf(s.resolved),
            "isOutdated" => ResolvedValue::leaf(s.outdated),
            "path" => ResolvedValue::leaf(s.path.clone()),
            "line" => int(s.line),
            "originalLine" => int(s.original_line),
            "startLine" | "originalStartLine" | "startDiffSide" => ResolvedValue::null(),
            "diffSide" => ResolvedValue::leaf("RIGHT"),
            "subjectType" => ResolvedValue::leaf("LINE"),
            "viewerCanResolve" => ResolvedValue::leaf(s.can_resolve && !s.resolved),
            "viewerCanUnresolve" => ResolvedValue::leaf(s.can_resolve && s.resolved),
            "viewerCanReply" => ResolvedValue::leaf(self.ctx.may(&t.repo, PULLS_WRITE)),
            "comments" => return self.comments(info),
            _ => return Err(self.ctx.unimplemented(self.type_name(), info)),
        })
    }
}

impl ThreadObj<'_> {
    fn comments<'b>(&'b self, info: &'b ResolveInfo<'b>) -> Result<ResolvedValue<'b>, FieldError> {
        let ctx = self.ctx;
        let known = ["first", "last", "after", "before"];
        let a = args(ctx, info, "PullRequestReviewThread", &known)?;
        let ids: Vec<u64> = self.thread.comments.iter().map(|c| c.id).collect();
        let (range, page) = paginate(ctx, a, "comments", &ids)?;
        let nodes = range
            .map(|index| CommentObj {
                ctx,
                thread: self.thread.clone(),
                index,
            })
            .collect();
        Ok(ResolvedValue::object(Connection {
            ctx,
            type_name: "PullRequestReviewCommentConnection",
            total: ids.len(),
            page,
            nodes,
        }))
    }
}

#[derive(Clone)]
struct CommentObj<'a> {
    ctx: &'a Ctx<'a>,
    thread: Arc<Thread>,
    index: usize,
}

impl ObjectValue for CommentObj<'_> {
    fn type_name(&self) -> &str {
        "PullRequestReviewComment"
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        let t = &self.thread;
        let c = &t.comments[self.index];
        Ok(match info.field_name() {
            "id" => ResolvedValue::leaf(format!("PRRC_{}", c.id)),
            "databaseId" => ResolvedValue::leaf(c.id as i64),
            "fullDatabaseId" => ResolvedValue::leaf(c.id.to_string()),
            "author" => ResolvedValue::nullable_object(c.author.as_ref().map(|login| Actor {
                login: login.clone(),
                is_bot: c.is_bot,
            })),
            "body" => ResolvedValue::leaf(c.body.clone()),
            "createdAt" => ResolvedValue::leaf(c.created_at.clone()),
            "diffHunk" => ResolvedValue::leaf(t.spec.diff_hunk.clone()),
            "path" => ResolvedValue::leaf(t.spec.path.clone()),
            "url" => ResolvedValue::leaf(format!(
                "https://github.com/{}/pull/{}#discussion_r{}",
                t.full_name, t.pull, c.id
            )),
            _ => return Err(self.ctx.unimplemented(self.type_name(), info)),
        })
    }
}

/// A comment's author: a `User`, or a `Bot` (an App).
struct Actor {
    login: String,
    is_bot: bool,
}

impl ObjectValue for Actor {
    fn type_name(&self) -> &str {
        if self.is_bot {
            "Bot"
        } else {
            "User"
        }
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        match info.field_name() {
            "login" => Ok(ResolvedValue::leaf(self.login.clone())),
            "url" => Ok(ResolvedValue::leaf(format!(
                "https://github.com/{}",
                self.login
            ))),
            _ => Err(self.unknown_field_error(info)),
        }
    }
}

// -------------------------------------------------------------------------------------
// Connections
// -------------------------------------------------------------------------------------

struct Connection<'a, T> {
    ctx: &'a Ctx<'a>,
    type_name: &'static str,
    total: usize,
    page: PageInfo,
    nodes: Vec<T>,
}

impl<'a, T: ObjectValue + Clone + 'a> ObjectValue for Connection<'a, T> {
    fn type_name(&self) -> &str {
        self.type_name
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        match info.field_name() {
            "totalCount" => Ok(ResolvedValue::leaf(self.total as i64)),
            "pageInfo" => Ok(ResolvedValue::object(self.page.clone())),
            "nodes" => Ok(ResolvedValue::list(
                self.nodes.iter().cloned().map(ResolvedValue::object),
            )),
            _ => Err(self.ctx.unimplemented(self.type_name, info)),
        }
    }
}

#[derive(Clone)]
struct PageInfo {
    has_next: bool,
    has_previous: bool,
    start: Option<String>,
    end: Option<String>,
}

impl ObjectValue for PageInfo {
    fn type_name(&self) -> &str {
        "PageInfo"
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        let cursor = |c: &Option<String>| {
            c.clone()
                .map_or_else(ResolvedValue::null, ResolvedValue::leaf)
        };
        match info.field_name() {
            "hasNextPage" => Ok(ResolvedValue::leaf(self.has_next)),
            "hasPreviousPage" => Ok(ResolvedValue::leaf(self.has_previous)),
            "startCursor" => Ok(cursor(&self.start)),
            "endCursor" => Ok(cursor(&self.end)),
            _ => Err(self.unknown_field_error(info)),
        }
    }
}

fn cursor_of(id: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("cursor:v2:{id}"))
}

fn cursor_key(cursor: &str) -> Option<u64> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(cursor)
        .ok()?;
    String::from_utf8(bytes)
        .ok()?
        .strip_prefix("cursor:v2:")?
        .parse()
        .ok()
}

/// The items of a connection (`ids`: their cursor keys, ascending) that `first`/`last` and
/// `after`/`before` select, as GitHub pages: exactly one of `first` and `last`, 0 to 100,
/// and cursors it handed out. A request GitHub refuses is refused (and recorded).
fn paginate(
    ctx: &Ctx,
    a: &JsonMap,
    connection: &str,
    ids: &[u64],
) -> Result<(Range<usize>, PageInfo), FieldError> {
    let count = |name: &str| a.get(name).and_then(JsonValue::as_i64);
    let (first, last) = (count("first"), count("last"));
    let (which, n) = match (first, last) {
        (Some(n), None) => ("first", n),
        (None, Some(n)) => ("last", n),
        (None, None) => return Err(ctx.refuse(
            Some("MISSING_PAGINATION_BOUNDARIES"),
            format!("You must provide a `first` or `last` value to properly paginate the `{connection}` connection."),
        )),
        (Some(_), Some(_)) => return Err(ctx.refuse(
            None,
            format!("Passing both `first` and `last` to paginate the `{connection}` connection is not supported."),
        )),
    };
    let Some(n) = usize::try_from(n).ok().filter(|n| *n <= 100) else {
        return Err(ctx.refuse(
            Some("EXCESSIVE_PAGINATION"),
            format!("Requesting {n} records on the `{connection}` connection exceeds the `{which}` limit of 100 records."),
        ));
    };
    let cursor = |name: &str| match a.get(name).and_then(JsonValue::as_str) {
        None => Ok(None),
        Some(c) => cursor_key(c).map(Some).ok_or_else(|| {
            ctx.refuse(
                Some("INVALID_CURSOR_ARGUMENTS"),
                format!("`{c}` does not appear to be a valid cursor."),
            )
        }),
    };
    let (after, before) = (cursor("after")?, cursor("before")?);
    let lo = after.map_or(0, |c| ids.partition_point(|&id| id <= c));
    let hi = before
        .map_or(ids.len(), |c| ids.partition_point(|&id| id < c))
        .max(lo);
    let window = hi - lo;
    let range = if which == "first" {
        lo..lo + window.min(n)
    } else {
        hi - window.min(n)..hi
    };
    let page = PageInfo {
        has_next: if which == "first" {
            window > n
        } else {
            before.is_some() && hi < ids.len()
        },
        has_previous: if which == "last" {
            window > n
        } else {
            after.is_some() && lo > 0
        },
        start: (!range.is_empty()).then(|| cursor_of(ids[range.start])),
        end: (!range.is_empty()).then(|| cursor_of(ids[range.end - 1])),
    };
    Ok((range, page))
}

// -------------------------------------------------------------------------------------
// Mutations
// -------------------------------------------------------------------------------------

/// What a mutation answers: its payload object.
struct Payload<'a> {
    ctx: &'a Ctx<'a>,
    value: Payloaded<'a>,
    client_mutation_id: Option<String>,
}

enum Payloaded<'a> {
    Ready(PullRequestObj<'a>),
    Reply(CommentObj<'a>),
    Resolved(ThreadObj<'a>),
}

impl ObjectValue for Payload<'_> {
    fn type_name(&self) -> &str {
        match self.value {
            Payloaded::Ready(_) => "MarkPullRequestReadyForReviewPayload",
            Payloaded::Reply(_) => "AddPullRequestReviewThreadReplyPayload",
            Payloaded::Resolved(_) => "ResolveReviewThreadPayload",
        }
    }

    fn resolve_field<'b>(
        &'b self,
        info: &'b ResolveInfo<'b>,
    ) -> Result<ResolvedValue<'b>, FieldError> {
        match (&self.value, info.field_name()) {
            (_, "clientMutationId") => Ok(self
                .client_mutation_id
                .clone()
                .map_or_else(ResolvedValue::null, ResolvedValue::leaf)),
            (Payloaded::Ready(p), "pullRequest") => Ok(ResolvedValue::object(p.clone())),
            (Payloaded::Reply(c), "comment") => Ok(ResolvedValue::object(c.clone())),
            (Payloaded::Resolved(t), "thread") => Ok(ResolvedValue::object(t.clone())),
            _ => Err(self.ctx.unimplemented(self.type_name(), info)),
        }
    }
}

fn payload<'b>(ctx: &'b Ctx<'b>, input: &JsonMap, value: Payloaded<'b>) -> ResolvedValue<'b> {
    let client_mutation_id = input
        .get("clientMutationId")
        .and_then(JsonValue::as_str)
        .map(str::to_string);
    ResolvedValue::object(Payload {
        ctx,
        value,
        client_mutation_id,
    })
}

/// `markPullRequestReadyForReview(input: {pullRequestId})`: the draft becomes ready.
fn mark_ready<'b>(
    ctx: &'b Ctx<'b>,
    info: &'b ResolveInfo<'b>,
) -> Result<ResolvedValue<'b>, FieldError> {
    let input = input(ctx, info, &["pullRequestId", "clientMutationId"])?;
    let node = text(input, "pullRequestId");
    let number = node
        .strip_prefix("PR_")
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or_else(|| not_found(&node))?;
    let key = {
        let st = ctx.fake.state();
        st.repos
            .iter()
            .find(|(_, r)| r.issues.get(&number).is_some_and(|i| i.pull.is_some()))
            .map(|(k, _)| k.clone())
    }
    .ok_or_else(|| not_found(&node))?;
    ctx.auth(&key, PULLS_WRITE, missing_node(&node))?;
    {
        let mut st = ctx.fake.state();
        let issue = st
            .repos
            .get_mut(&key)
            .unwrap()
            .issues
            .get_mut(&number)
            .unwrap();
        issue.pull.as_mut().unwrap().draft = false;
    }
    let pr = PullRequestObj { ctx, key, number };
    Ok(payload(ctx, input, Payloaded::Ready(pr)))
}

/// `addPullRequestReviewThreadReply(input: {pullRequestReviewThreadId, body})`: a comment
/// by the App's bot at the end of the thread.
fn add_reply<'b>(
    ctx: &'b Ctx<'b>,
    info: &'b ResolveInfo<'b>,
) -> Result<ResolvedValue<'b>, FieldError> {
    let known = ["pullRequestReviewThreadId", "body", "clientMutationId"];
    let input = input(ctx, info, &known)?;
    let id = text(input, "pullRequestReviewThreadId");
    let (n, thread) = ctx.thread(&id)?;
    ctx.auth(&thread.repo, PULLS_WRITE, missing_node(&id))?;
    let body = text(input, "body");
    if body.trim().is_empty() {
        return Err(ctx.refuse(Some("UNPROCESSABLE"), "Body can't be blank".into()));
    }
    if body.chars().count() > MAX_BODY_CHARS {
        return Err(ctx.refuse(
            Some("UNPROCESSABLE"),
            format!("Body is too long (maximum is {MAX_BODY_CHARS} characters)"),
        ));
    }
    let bot = ctx.fake.bot_login();
    let snapshot = {
        let mut st = ctx.fake.state();
        let id = st.next_id();
        let t = st.graphql.threads.get_mut(&n).expect("looked up above");
        t.comments.push(ThreadComment {
            id,
            author: Some(bot),
            is_bot: true,
            body: body.clone(),
            created_at: iso8601(SystemTime::now()),
        });
        t.replies.push(body);
        Arc::new(t.clone())
    };
    let index = snapshot.comments.len() - 1;
    let comment = CommentObj {
        ctx,
        thread: snapshot,
        index,
    };
    Ok(payload(ctx, input, Payloaded::Reply(comment)))
}

/// `resolveReviewThread(input: {threadId})`: refused (`FORBIDDEN`) for a thread added with
/// `can_resolve: false`.
fn resolve_thread<'b>(
    ctx: &'b Ctx<'b>,
    info: &'b ResolveInfo<'b>,
) -> Result<ResolvedValue<'b>, FieldError> {
    let input = input(ctx, info, &["threadId", "clientMutationId"])?;
    let id = text(input, "threadId");
    let (n, thread) = ctx.thread(&id)?;
    ctx.auth(&thread.repo, PULLS_WRITE, missing_node(&id))?;
    let snapshot = {
        let mut st = ctx.fake.state();
        if !thread.spec.can_resolve {
            let what = ctx.req.what();
            st.forbidden.push(format!(
                "{what}: resolveReviewThread {id}: viewerCanResolve is false"
            ));
            return Err(typed("FORBIDDEN", NOT_ACCESSIBLE));
        }
        let t = st.graphql.threads.get_mut(&n).expect("looked up above");
        t.spec.resolved = true;
        Arc::new(t.clone())
    };
    let thread = ThreadObj {
        ctx,
        n,
        thread: snapshot,
    };
    Ok(payload(ctx, input, Payloaded::Resolved(thread)))
}
