// Minimal Probot app: the baseline of bench/webhook-load.sh.
//
// It handles `issue_comment.created`, looks for a `/kodx` command line in the comment,
// and does nothing else (no GitHub calls). Probot's own server (`run`) verifies
// X-Hub-Signature-256 with WEBHOOK_SECRET before the handler sees anything.
//
//   APP_ID=1 PRIVATE_KEY_PATH=key.pem WEBHOOK_SECRET=… HOST=127.0.0.1 PORT=3001 node app.js
//
// Webhook path: /api/github/webhooks (Probot's default). GET /bench/seen answers how many
// comments the handler saw with and without a command, so the bench can check that a
// request with a bad signature never reached it.
import { fileURLToPath } from "node:url";
import { run } from "probot";

const COMMAND = /^[ \t]*\/kodx\b/m;
const seen = { command: 0, no_command: 0 };

export default function app(probot, { addHandler } = {}) {
  addHandler?.((req, res) => {
    if (req.method !== "GET" || req.url !== "/bench/seen") return false;
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(seen));
    return true;
  });
  probot.on("issue_comment.created", async (context) => {
    const body = context.payload.comment.body ?? "";
    if (COMMAND.test(body)) {
      seen.command += 1;
    } else {
      seen.no_command += 1;
    }
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  process.on("SIGTERM", () => process.exit(0));
  await run(app);
}
