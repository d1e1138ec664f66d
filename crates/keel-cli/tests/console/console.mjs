// The web console in a real browser: Debian's chromium driven by playwright-core, against
// a real `keel serve` the Rust test (tests/it/console.rs) started. Run by that test as
//   node console.mjs <scenario>
// with CONSOLE_TEST set to a JSON object: {base, token, keel, data_dir, repo, agents,
// artifacts, playwright, ...scenario fields}. Prints one JSON line of results; any failed
// check throws (exit status 1) naming what the page showed.

import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";

const config = JSON.parse(process.env.CONSOLE_TEST);
const scenario = process.argv[2];
const { chromium } = createRequire(join(config.playwright, "/"))("playwright-core");

function check(condition, message) {
  if (!condition) throw new Error(`console check failed: ${message}`);
}

/** The real `keel` binary, as the operator (or `token`'s tenant). */
function keel(args, token) {
  const env = { ...process.env, KEEL_DATA_DIR: config.data_dir };
  delete env.KEEL_ADDR;
  delete env.KEEL_LLM_SCRIPT;
  if (token) env.KEEL_API_TOKEN = token;
  else delete env.KEEL_API_TOKEN;
  return execFileSync(config.keel, args, { env, cwd: config.repo, encoding: "utf8" });
}

function detach(args, token) {
  return JSON.parse(keel(["run", "--detach", "--json", "--sandbox", "none", ...args], token)).run_id;
}

const agent = (name) => join(config.agents, name);

async function api(path, token = config.token) {
  const response = await fetch(config.base + path, { headers: { Authorization: `Bearer ${token}` } });
  const body = await response.json();
  if (!response.ok) throw new Error(`${path}: ${response.status} ${JSON.stringify(body)}`);
  return body;
}

async function until(what, fn, timeoutMs = 60000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function launch() {
  const profile = mkdtempSync(join(tmpdir(), "keel-console-profile-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--no-first-run"],
    viewport: { width: 1360, height: 900 },
  });
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(60000);
  // Any script error or Content-Security-Policy violation fails the scenario.
  const problems = [];
  page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
  page.on("console", (msg) => {
    if (msg.type() === "error" && !/Failed to load resource/.test(msg.text())) problems.push(`console error: ${msg.text()}`);
  });
  const close = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
    check(!problems.length, problems.join("\n"));
  };
  return { page, close };
}

async function shot(page, name) {
  await page.screenshot({ path: join(config.artifacts, `${name}.png`), fullPage: true });
}

async function login(page, token) {
  await page.goto(config.base + "/ui");
  await page.fill("#token", token);
  await page.click("#login button[type=submit]");
  await page.waitForSelector("#runs");
  await page.waitForFunction(() => document.body.dataset.live === "on");
}

async function text(page, selector) {
  return (await page.textContent(selector)) || "";
}

// ------------------------------------------------------------------ scenarios

async function main() {
  const { page, close } = await launch();
  const results = {};

  // Log in: a bad token shows the API's own message; the right one opens the runs.
  await page.goto(config.base + "/ui");
  await page.fill("#token", "not-a-token");
  await page.click("#login button[type=submit]");
  await page.waitForSelector("[data-role=login-error]:not(:empty)");
  const refused = await text(page, "[data-role=login-error]");
  check(refused.includes("missing, wrong or revoked bearer token"), `a bad token shows the API's message, not ${refused}`);
  await shot(page, "login");
  await login(page, config.token);

  // A run started from the CLI appears in the open list, without a reload.
  await page.evaluate(() => { window.sameDocument = true; });
  const run = detach(["--", "python3", agent("console_agent.py")]);
  await page.waitForSelector(`#runs tr[data-run="${run}"]`);
  check(await page.evaluate(() => window.sameDocument === true), "the run appeared by the live stream, not a reload");
  await page.waitForSelector(`#runs tr[data-run="${run}"] [data-state="waiting"]`);
  await shot(page, "runs");

  // Its page: the timeline has its syscalls; a bar shows its params and result.
  await page.click(`#runs tr[data-run="${run}"] a`);
  await page.waitForSelector('#timeline rect[data-method="human.ask"]');
  for (const method of ["llm.chat", "tool.call", "human.ask"]) {
    check(await page.$(`#timeline rect[data-method="${method}"]`), `the timeline shows ${method}`);
  }
  await page.click('#timeline rect[data-method="llm.chat"]');
  await page.waitForSelector("#entry-detail");
  const detail = await text(page, "#entry-detail");
  check(detail.includes("plan the release") && detail.includes("Release plan: build, test, ship."),
    `the llm.chat bar shows its params and result: ${detail.slice(0, 300)}`);
  await page.waitForFunction(() => document.getElementById("logs").textContent.includes("console agent starting"));
  check((await text(page, "[data-role=question]")) === "Ship it?", "the open question is shown");
  await page.waitForSelector('#budget, #run-cost');
  await shot(page, "run");

  // Answering the question in the page finishes the run.
  await page.fill("#question textarea[name=answer]", "ship it");
  await page.click("#question button[type=submit]");
  await page.waitForSelector('#view .panel [data-state="succeeded"]');
  await page.waitForFunction(() => document.getElementById("output").textContent.includes("ship it"));
  const finished = await api(`/v1/runs/${run}`);
  check(finished.state === "succeeded" && finished.output.answer === "ship it", `the run finished with the answer: ${JSON.stringify(finished.output)}`);
  results.answered = run;

  // A call parked for approval, approved from the inbox with a note: the run goes on.
  const input = JSON.stringify({ calls: [{ tool: "kv.put", args: { key: "a", value: 1 } }, { tool: "kv.get", args: { key: "a" } }] });
  const parked = detach(["--grant", "kv.*", "--input", input, "--", "python3", agent("tools_agent.py")]);
  await page.goto(config.base + "/ui/#/inbox");
  const item = `#inbox [data-run="${parked}"][data-kind="approval"]`;
  await page.waitForSelector(item);
  check((await text(page, `${item} [data-role=summary]`)).includes("kv.put"), "the inbox names the parked tool");
  await page.waitForSelector("#inbox-count:not([hidden])");
  await shot(page, "inbox");
  await page.fill(`${item} input[name=note]`, "looks fine");
  await page.click(`${item} [data-action=approve]`);
  await page.waitForSelector(item, { state: "detached" });
  const done = await until("the approved run to finish", async () => {
    const view = await api(`/v1/runs/${parked}`);
    return ["succeeded", "failed"].includes(view.state) && view;
  });
  check(done.state === "succeeded", `the approved run went on: ${done.state} ${done.error || ""}`);
  check(JSON.stringify(done.output.results) === JSON.stringify([{ ok: true }, { ok: 1 }]),
    `the approved call ran and the next one read it: ${JSON.stringify(done.output)}`);
  const audit = await api(`/v1/audit?run=${parked}`);
  check(audit.some((a) => a.action === "approval.granted" && JSON.stringify(a.detail).includes("looks fine")),
    `the approval and its note are audited: ${JSON.stringify(audit.map((a) => a.action))}`);
  results.approved = parked;

  // Cost: the answered run's LLM call, by tenant and by model, and in the costliest runs.
  await page.goto(config.base + "/ui/#/costs");
  await page.waitForFunction(() => [...document.querySelectorAll("#chart-model svg rect")].some((r) => Number(r.getAttribute("height")) > 0));
  const models = await text(page, "#chart-model .legend");
  check(models.includes("scripted"), `the model chart names the model that answered: ${models}`);
  await page.waitForSelector(`#top-runs a[href="#/runs/${run}"]`);
  const totals = await text(page, "#cost-totals");
  check(totals.includes("default") && totals.includes("1,600"), `the totals show the call's 1,600 tokens: ${totals}`);
  await shot(page, "costs");

  // Health: the kernel, its store and (alone) one node.
  await page.goto(config.base + "/ui/#/health");
  await page.waitForSelector("#health-kernel");
  check((await text(page, "#health-kernel")).includes("ok"), "the health page shows the kernel and store ok");
  await shot(page, "health");

  await close();
  return results;
}

/** A tenant's token sees its tenant only: the list, a direct link, the live stream. */
async function tenant() {
  const { page, close } = await launch();
  const { tenant_token: token, own_run: own, other_run: other } = config;
  await login(page, token);
  await page.waitForSelector(`#runs tr[data-run="${own}"]`);
  check(!(await page.$(`#runs tr[data-run="${other}"]`)), "another tenant's run is not listed");
  const rows = await page.$$eval("#runs tbody tr[data-run]", (trs) => trs.map((tr) => tr.dataset.run));
  check(rows.length === 1 && rows[0] === own, `only the tenant's own run is listed: ${rows}`);
  // Searching for the other run's id finds nothing.
  await page.fill("#filter-text", other);
  await page.waitForSelector("#runs tbody td.muted");
  // Asking for another tenant is refused with the API's message.
  await page.fill("#filter-text", "");
  await page.fill("#filter-tenant", config.other_tenant);
  await page.waitForSelector("[data-role=error]:not(:empty)");
  const refusal = await text(page, "[data-role=error]");
  check(refusal.includes(`cannot act for tenant ${config.other_tenant}`), `asking for another tenant is refused: ${refusal}`);
  await page.fill("#filter-tenant", "");
  // A run of the other tenant started now never reaches this page; one of its own does
  // (the stream is in order, so the other's change came first).
  await page.evaluate(() => { window.sameDocument = true; });
  const later = detach(["--", "sleep", "30"], config.other_token);
  const mine = detach(["--", "sleep", "30"], token);
  await page.waitForSelector(`#runs tr[data-run="${mine}"]`);
  check(!(await page.$(`#runs tr[data-run="${later}"]`)), "another tenant's new run does not appear live");
  check(await page.evaluate(() => window.sameDocument === true), "the tenant's own new run appeared live");
  await shot(page, "tenant-runs");
  // A direct link to the other tenant's run answers like a missing run.
  await page.goto(config.base + `/ui/#/runs/${other}`);
  await page.waitForSelector("[data-role=error]:not(:empty)");
  const missing = await text(page, "[data-role=error]");
  check(/not found|no run|no such/i.test(missing), `another tenant's run reads as missing: ${missing}`);
  await shot(page, "tenant-other-run");
  // Inbox and costs hold nothing of the other tenant.
  const inbox = await api("/v1/inbox", token);
  check(inbox.items.every((i) => i.run.tenant === config.tenant), "the inbox holds only the tenant's runs");
  const costs = await api("/v1/costs", token);
  check(costs.buckets.every((b) => b.tenant === config.tenant), "costs hold only the tenant's calls");
  keel(["stop", later]);
  keel(["stop", mine]);
  await close();
  return { own, mine };
}

/** A question with a form, answered through the rendered form; UI blocks in order. */
async function form() {
  const { page, close } = await launch();
  await login(page, config.token);
  const run = detach(["--", "python3", agent("console_form_agent.py")]);
  await page.goto(config.base + `/ui/#/runs/${run}`);
  await page.waitForSelector('#question form[data-form="answer"]');
  // The agent's blocks, in order; its markdown is rendered, its HTML only text.
  await page.waitForSelector('#blocks [data-block="table"]');
  const kinds = await page.$$eval("#blocks [data-block]", (els) => els.map((el) => el.dataset.block));
  check(JSON.stringify(kinds) === JSON.stringify(["markdown", "table"]), `blocks in order: ${kinds}`);
  check(await page.$('#blocks [data-block="markdown"] strong'), "markdown emphasis is rendered");
  check(!(await page.$("#blocks script")), "the agent's <script> is not markup");
  check((await text(page, '#blocks [data-block="markdown"]')).includes("<script>alert(1)</script>"), "the agent's HTML is shown as text");
  // Client-side validation: required fields, then the schema's maximum.
  await page.click("#question button[type=submit]");
  await page.waitForSelector("#question [data-role=form-status]:not(:empty)");
  check((await text(page, "#question [data-role=form-status]")).includes("region is required"), "a required field is asked for");
  await page.selectOption('#question [data-field="region"] select', "eu");
  await page.fill('#question [data-field="replicas"] input', "12");
  await page.click("#question button[type=submit]");
  await page.waitForFunction(() => document.querySelector("#question [data-role=form-status]").textContent.includes("at most 9"));
  await shot(page, "form");
  await page.fill('#question [data-field="replicas"] input', "3");
  await page.check('#question [data-field="canary"] input');
  await page.click("#question button[type=submit]");
  const done = await until("the form's run to finish", async () => {
    const view = await api(`/v1/runs/${run}`);
    return ["succeeded", "failed"].includes(view.state) && view;
  });
  const sorted = (o) => JSON.stringify(Object.fromEntries(Object.entries(o).sort(([a], [b]) => a.localeCompare(b))));
  check(sorted(done.output.answer) === sorted({ region: "eu", replicas: 3, canary: true }),
    `the agent received the form's value: ${JSON.stringify(done.output)}`);
  await close();
  return { run };
}

/** Time from navigation to the first rendered row, with the store's many runs. */
async function bench() {
  const { page, close } = await launch();
  await login(page, config.token);
  const times = [];
  for (let i = 0; i < config.rounds; i++) {
    await page.goto(`${config.base}/ui/?round=${i}#/runs`);
    await page.waitForFunction(() => window.keelFirstRowAt !== undefined);
    times.push(await page.evaluate(() => window.keelFirstRowAt));
  }
  const rows = await page.$$eval("#runs tbody tr[data-run]", (trs) => trs.length);
  check(rows === 50, `a page of 50 rows, not ${rows}`);
  // A search among them, answered by the store's query.
  const started = Date.now();
  await page.fill("#filter-text", config.needle);
  await page.waitForFunction(() => document.querySelectorAll("#runs tbody tr[data-run]").length === 1);
  const search = Date.now() - started;
  // Sorted by cost: the costliest run first.
  await page.selectOption("#sort", "costliest");
  await page.fill("#filter-text", "");
  await page.waitForSelector(`#runs tbody tr[data-run="${config.costliest}"]:first-child`);
  await shot(page, "runs-10000");
  await close();
  times.sort((a, b) => a - b);
  return { first_row_ms: times, median_ms: times[Math.floor(times.length / 2)], search_ms_incl_debounce: search };
}

/** Every action of a run's page and the inbox, clicked in the page and checked through the
 *  API: children under their parent, pause and resume, a message, a budget top-up from
 *  the inbox, a denial with a note, a stop, and a loop let go on. */
async function actions() {
  const { page, close } = await launch();
  const results = {};
  await login(page, config.token);
  const scripts = mkdtempSync(join(tmpdir(), "keel-console-actions-"));
  const script = (name, body) => {
    const path = join(scripts, name);
    writeFileSync(path, JSON.stringify(body));
    return path;
  };
  const stateOf = async (run) => (await api(`/v1/runs/${run}`));

  // A parent with a child: the child's row is nested under the parent's.
  const twoCalls = script("two.json", { responses: [{ content: "one" }, { content: "two" }] });
  const parent = detach(["--llm-script", twoCalls, "--budget-llm-calls", "1", "--", "python3", agent("console_actions_agent.py")]);
  const child = await until("the child run", async () => {
    const runs = await api("/v1/runs?limit=50");
    return (runs.find((r) => r.parent === parent) || {}).run_id;
  });
  await page.goto(config.base + "/ui/#/runs");
  await page.waitForSelector(`#runs tr[data-run="${child}"][data-depth="1"]`);
  const nested = await page.evaluate(([p, c]) => {
    const row = document.querySelector(`#runs tr[data-run="${c}"]`);
    return row.previousElementSibling && row.previousElementSibling.dataset.run === p;
  }, [parent, child]);
  check(nested, "the child's row comes right under its parent's");
  await shot(page, "actions-children");

  // Pause, then resume, from the run's page.
  await page.goto(config.base + `/ui/#/runs/${parent}`);
  await page.waitForSelector("[data-action=pause]:not([disabled])");
  await page.click("[data-action=pause]");
  await until("the run to be paused", async () => (await stateOf(parent)).state === "paused");
  await page.waitForSelector("[data-action=resume]:not([disabled])");
  await page.click("[data-action=resume]");
  await until("the run to be resumed", async () => (await stateOf(parent)).state !== "paused");
  // Its agent takes the resume signal, then waits for the next message. The page is drawn
  // again at each change of state (and its layout can move), so the message is typed only
  // once the page shows that wait, which lasts until the message arrives.
  await until("the run to wait for a message", async () => (await stateOf(parent)).wait_reason === "message");
  await page.waitForFunction(() => {
    const badge = document.querySelector("h1.mono ~ .badge[data-state]");
    return badge && badge.textContent === "waiting (message)";
  });

  // A message from the page: the run reads it and goes on to its second call, which
  // parks on the one-call budget.
  await page.fill("form[data-form=message] textarea", '{"go": 1}');
  await page.click("form[data-form=message] button[type=submit]");
  await until("the run to park on its budget", async () => (await stateOf(parent)).wait_reason === "budget");

  // The inbox shows the budget; topping it up there lets the run finish.
  await page.goto(config.base + "/ui/#/inbox");
  const budgetItem = `#inbox [data-run="${parent}"][data-kind="budget"]`;
  await page.waitForSelector(budgetItem);
  await shot(page, "actions-inbox-budget");
  await page.fill(`${budgetItem} input[name=llm_calls]`, "1");
  await page.click(`${budgetItem} form[data-form=top-up] button[type=submit]`);
  const topped = await until("the topped-up run to finish", async () => {
    const view = await stateOf(parent);
    return ["succeeded", "failed"].includes(view.state) && view;
  });
  check(topped.state === "succeeded" && JSON.stringify(topped.output.message) === '{"go":1}',
    `the run got the page's message and finished after the top-up: ${topped.state} ${JSON.stringify(topped.output)}`);
  check(topped.budget.limits.llm_calls === 2, `the top-up added one call: ${JSON.stringify(topped.budget)}`);
  results.topped_up = parent;

  // A parked call denied from the run's page, with a note.
  const input = JSON.stringify({ calls: [{ tool: "kv.put", args: { key: "b", value: 2 } }] });
  const denied = detach(["--grant", "kv.*", "--input", input, "--", "python3", agent("tools_agent.py")]);
  await page.goto(config.base + `/ui/#/runs/${denied}`);
  await page.waitForSelector("[data-call] [data-action=deny]");
  await page.fill("[data-call] input[name=note]", "not this one");
  await page.click("[data-call] [data-action=deny]");
  const deniedRun = await until("the denied run to finish", async () => {
    const view = await stateOf(denied);
    return ["succeeded", "failed"].includes(view.state) && view;
  });
  check(deniedRun.output.results[0].error === "denied" && deniedRun.output.results[0].message.includes("not this one"),
    `the agent got the denial and its note: ${JSON.stringify(deniedRun.output)}`);

  // Stop, after the page's confirmation.
  const sleeper = detach(["--", "python3", "-c", "import time; time.sleep(600)"]);
  await page.goto(config.base + `/ui/#/runs/${sleeper}`);
  await page.waitForSelector("[data-action=stop]:not([disabled])");
  page.once("dialog", (dialog) => dialog.accept());
  await page.click("[data-action=stop]");
  const stopped = await until("the stopped run to end", async () => {
    const view = await stateOf(sleeper);
    return ["succeeded", "failed", "cancelled"].includes(view.state) && view;
  });
  check(stopped.state === "cancelled", `the stopped run is cancelled: ${stopped.state}`);

  // A loop, let go on from the inbox.
  const loop = script("loop.json", { responses: [{ match: "there yet", content: "no" }] });
  const looping = detach(["--llm-script", loop, "--loop-threshold", "3", "--", "python3", agent("loop_agent.py")]);
  await page.goto(config.base + "/ui/#/inbox");
  const loopItem = `#inbox [data-run="${looping}"][data-kind="loop"]`;
  await page.waitForSelector(loopItem);
  check((await page.isChecked(`${loopItem} input[name=continue]`)), "a loop's form lets it go on by default");
  await shot(page, "actions-inbox-loop");
  await page.click(`${loopItem} form[data-form=top-up] button[type=submit]`);
  const goneOn = await until("the loop to go on and finish", async () => {
    const view = await stateOf(looping);
    return ["succeeded", "failed"].includes(view.state) && view;
  });
  check(goneOn.state === "succeeded" && goneOn.provider_calls === 3, `the loop went on: ${goneOn.state} ${goneOn.provider_calls}`);

  rmSync(scripts, { recursive: true, force: true });
  await close();
  return results;
}

const scenarios = { main, tenant, form, bench, actions };
check(scenarios[scenario], `no scenario ${scenario}`);
const result = await scenarios[scenario]();
writeFileSync(join(config.artifacts, `${scenario}.json`), JSON.stringify(result, null, 2));
console.log(JSON.stringify(result));
