// The dashboard in a real browser: headless Chromium (Debian's package) driven by playwright-core (npm), started
// by crates/portico/tests/dashboard.rs, which runs Portico, its backends and a load generator, and does what a
// step asks for on stdin/stdout ("STEP name" from here, "done" back). Screenshots go to $ARTIFACTS.
// Environment: ADMIN (http://IP:PORT), PROXY (http://IP:PORT, the loaded listener `web`), SIDE (http://IP:PORT,
// the listener `side`, which the load does not reach), TOKEN, KILLED (the endpoint the test kills),
// TOOLS (where node_modules/playwright-core is), ARTIFACTS, CHROMIUM.
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as readline from "node:readline";

const require = createRequire(join(process.env.TOOLS, "package.json"));
const { chromium } = require("playwright-core");

const { ADMIN, PROXY, SIDE, TOKEN, KILLED, ARTIFACTS } = process.env;
const lines = readline.createInterface({ input: process.stdin });
const waiting = [];
lines.on("line", (line) => waiting.shift()?.(line));

async function step(name) {
  const answer = new Promise((resolve) => waiting.push(resolve));
  process.stdout.write(`STEP ${name}\n`);
  const line = await answer;
  if (line !== "done") throw new Error(`step ${name}: ${line}`);
}

function log(text) {
  process.stderr.write(`[dashboard e2e] ${text}\n`);
}

function check(cond, what) {
  if (!cond) throw new Error(`failed: ${what}`);
  log(`ok: ${what}`);
}

const problems = [];
const expectedRefusals = new Set();

async function shot(page, name) {
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
  log(`screenshot ${name}.png`);
}

async function sectionShot(page, selector, name) {
  await page.locator(selector).screenshot({ path: join(ARTIFACTS, `${name}.png`) });
  log(`screenshot ${name}.png`);
}

function watch(page) {
  page.on("console", (msg) => {
    if (msg.type() !== "error" && msg.type() !== "warning") return;
    // Chromium logs every 4xx answer as an error: those the test provokes on purpose are not the page's.
    const status = /Failed to load resource: the server responded with a status of (\d+)/.exec(msg.text())?.[1];
    const url = msg.location()?.url;
    if (status && url && expectedRefusals.has(`${status} ${new URL(url).pathname}`)) return;
    problems.push(`console ${msg.type()}: ${msg.text()} (${url})`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("requestfailed", (req) => {
    const failure = req.failure()?.errorText || "";
    // The live updates' stream is cut when the page navigates or closes: not a failure.
    if (req.url().endsWith("/admin/events") && failure.includes("ERR_ABORTED")) return;
    problems.push(`request failed: ${req.method()} ${req.url()} ${failure}`);
  });
  page.on("response", (resp) => {
    const url = new URL(resp.url());
    if (url.origin !== ADMIN) problems.push(`request to another origin: ${resp.url()}`);
    if (resp.status() >= 400 && !expectedRefusals.has(`${resp.status()} ${url.pathname}`)) {
      problems.push(`answer ${resp.status()}: ${resp.request().method()} ${resp.url()}`);
    }
  });
}

const text = (page, selector) => page.locator(selector).first().textContent();

async function main() {
  const profile = mkdtempSync(join(tmpdir(), "portico-dashboard-chromium-"));
  // A fresh profile (--user-data-dir), which playwright passes itself for a persistent context.
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
    viewport: { width: 1440, height: 1000 },
  });
  try {
    const page = await context.newPage();
    watch(page);

    // 1. The page loads, with every header it should have, and goes live.
    const response = await page.goto(ADMIN + "/");
    const headers = response.headers();
    check(headers["content-security-policy"]?.includes("default-src 'none'") &&
      headers["content-security-policy"].includes("frame-ancestors 'none'"), "a strict Content-Security-Policy");
    check(headers["x-frame-options"] === "DENY", "X-Frame-Options: DENY");
    await page.waitForSelector("#live.ok", { timeout: 10_000 });
    await page.waitForFunction(() => Number(document.body.dataset.updates) >= 2, null, { timeout: 10_000 });
    check(true, "the page loaded and follows the live updates");
    await shot(page, "01-overview");

    // 2. The charts move while the load generator runs.
    const steps0 = Number(await page.evaluate(() => document.body.dataset.steps));
    const chart0 = await page.locator("#chart-rps canvas").screenshot();
    await page.waitForFunction((n) => Number(document.body.dataset.steps) >= n + 3, steps0, { timeout: 10_000 });
    const chart1 = await page.locator("#chart-rps canvas").screenshot();
    check(!chart0.equals(chart1), "the requests/s chart changed as new seconds came in");
    const rps = Number((await text(page, "#kpi-rps")).replace(/,/g, ""));
    check(rps > 0, `requests/s shows the load (${rps})`);
    const routeRows = await page.locator("#routes tbody tr").count();
    check(routeRows >= 2, `the routes table lists the routes (${routeRows})`);
    await sectionShot(page, "#overview", "02-charts-under-load");

    // 2b. The same charts per listener: the loaded one moves; the other is flat until requests reach it.
    const kpiRps = async () => Number((await text(page, "#kpi-rps")).replace(/,/g, ""));
    const chartMoves = async (what) => {
      const before = await page.locator("#chart-rps canvas").screenshot();
      const steps = Number(await page.evaluate(() => document.body.dataset.steps));
      await page.waitForFunction((n) => Number(document.body.dataset.steps) >= n + 2, steps, { timeout: 10_000 });
      check(!before.equals(await page.locator("#chart-rps canvas").screenshot()), `${what}: its requests/s chart moved`);
    };
    const webRow = '#listeners tbody tr[data-listener="web"]';
    await page.waitForSelector(`${webRow}.clickable`, { timeout: 10_000 });
    await page.locator(webRow).click();
    check((await page.locator("#scope option:checked").textContent()) === "listener: web", "a listener's row selects its charts");
    check((await page.locator(`${webRow}.selected`).count()) === 1, "the selected listener's row is marked");
    await chartMoves("listener web under load");
    const webRps = await kpiRps();
    check(webRps > 0, `the loaded listener shows its requests/s (${webRps})`);
    const webRowRps = Number((await page.locator(`${webRow} td:nth-child(4)`).textContent()).replace(/,/g, ""));
    check(webRowRps > 0, `the listeners table gives its requests/s (${webRowRps})`);
    await page.locator("#scope").selectOption({ label: "listener: side" });
    const idleRps = await kpiRps();
    check(idleRps === 0, `the listener the load does not reach shows no requests (${idleRps})`);
    // Requests to the side listener, until its chart shows them (bounded: 10 s).
    let sent = 0;
    const sideBefore = await page.locator("#chart-rps canvas").screenshot();
    const until = Date.now() + 10_000;
    while (Date.now() < until && !((await kpiRps()) > 0)) {
      for (let i = 0; i < 20; i++, sent++) await fetch(SIDE + "/side").then((r) => r.text());
      await page.waitForTimeout(100);
    }
    const sideRps = await kpiRps();
    check(sideRps > 0, `the side listener's chart shows the ${sent} requests sent to it (${sideRps}/s)`);
    check(!sideBefore.equals(await page.locator("#chart-rps canvas").screenshot()), "listener side: its requests/s chart moved");
    await sectionShot(page, "#overview", "02-listener-charts");
    await page.locator("#scope").selectOption({ label: "all routes" });

    // 3. A backend killed during the test turns red within its health-check interval (1 s here).
    const row = `#cluster-list [data-cluster="app"] tr[data-endpoint="${KILLED}"]`;
    check((await page.locator(row).getAttribute("data-state")) === "ok", "the endpoint is healthy before");
    await step("kill");
    const killedAt = Date.now();
    await page.waitForSelector(`${row}[data-state="down"]`, { timeout: 4_000 });
    const color = await page.locator(`${row} .pill`).evaluate((e) => getComputedStyle(e).backgroundColor);
    check(color === "rgb(207, 34, 46)", `the killed endpoint is red (${color}) after ${Date.now() - killedAt} ms`);
    // The cluster with only that endpoint now fails: its errors show with their reason.
    for (let i = 0; i < 5; i++) await fetch(PROXY + "/solo/x").then((r) => r.text());
    await page.waitForSelector("#error-list tbody tr", { timeout: 5_000 });
    const reason = await text(page, "#error-list tbody tr td:nth-child(3)");
    check(/upstream|endpoint/.test(reason), `the recent errors give the reason ("${reason}")`);
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: join(ARTIFACTS, "00-dashboard.png") });
    await sectionShot(page, "#clusters", "03-backend-down");
    await sectionShot(page, "#errors", "04-recent-errors");

    // 4. Actions need the token: refused without it (and with a wrong one), done with it.
    const bare = await fetch(ADMIN + "/admin/endpoints/drain", {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ cluster: "app", endpoint: KILLED }),
    });
    check(bare.status === 401, `a drain without the token is refused (${bare.status})`);
    // The killed endpoint is drained (draining the other one would leave the cluster nothing to serve with).
    const other = `#cluster-list [data-cluster="app"] tr.endpoint[data-endpoint="${KILLED}"]`;
    const otherAddress = KILLED;
    expectedRefusals.add("401 /admin/endpoints/drain");
    await page.locator(`${other} button[data-action="drain"]`).first().click();
    await page.waitForSelector("#token-dialog[open]");
    await page.fill("#token-input", "not-the-token");
    await shot(page, "05-token-asked");
    await page.click("#token-form button[type=submit]");
    // Refused: the page says so and asks again.
    await page.waitForSelector("#token-dialog[open]");
    check((await text(page, "#notice")).includes("not the configured one"), "the page says the token was refused");
    await page.fill("#token-input", TOKEN);
    await page.click("#token-form button[type=submit]");
    await page.waitForSelector(`#cluster-list [data-cluster="app"] tr[data-endpoint="${otherAddress}"][data-state="drained"]`, { timeout: 5_000 });
    check(true, "with the token, the endpoint is drained");
    const metrics = await (await fetch(ADMIN + "/metrics")).text();
    const invalid = Number(/portico_admin_denials_total\{reason="invalid"\} (\d+)/.exec(metrics)?.[1]);
    const missing = Number(/portico_admin_denials_total\{reason="missing"\} (\d+)/.exec(metrics)?.[1]);
    check(invalid >= 1 && missing >= 1, `refusals are counted (missing ${missing}, invalid ${invalid})`);
    await sectionShot(page, "#clusters", "06-endpoint-drained");
    // Enabled again, with the token kept for this tab (not asked again).
    await page.locator(`#cluster-list [data-cluster="app"] tr[data-endpoint="${otherAddress}"] button[data-action="enable"]`).click();
    await page.waitForSelector(`#cluster-list [data-cluster="app"] tr[data-endpoint="${otherAddress}"][data-state="down"]`, { timeout: 5_000 });
    check(!(await page.locator("#token-dialog[open]").count()), "the token was asked once");

    // 5. A reload shows up in the history with its diff; a refused one with its errors.
    await step("add-route");
    await page.click("#reload-button");
    await page.waitForSelector('#reload-list tbody tr[data-ok="true"]', { timeout: 10_000 });
    const first = page.locator("#reload-list tbody tr").first();
    check((await first.textContent()).includes("+ route extra"), "the reload lists what it changed");
    await first.locator("details summary").click();
    const diff = await first.locator("pre.diff").textContent();
    check(diff.includes("+  - name: extra"), "the reload's diff shows the added route");
    await step("break-config");
    expectedRefusals.add("422 /admin/reload");
    await page.click("#reload-button");
    await page.waitForSelector('#reload-list tbody tr[data-ok="false"]', { timeout: 10_000 });
    const refused = await page.locator('#reload-list tbody tr[data-ok="false"]').first().textContent();
    check(/portico\.yaml:\d+:\d+/.test(refused), "the refused reload shows its FILE:LINE:COL errors");
    await page.locator("details.running summary").click();
    check(!(await text(page, "#config-text")).includes(TOKEN), "the running configuration hides the token");
    await sectionShot(page, "#config", "07-reload-history");
    await shot(page, "08-full-page");

    // 6. A narrow window: the same page, no errors.
    await page.setViewportSize({ width: 390, height: 900 });
    await page.reload();
    await page.waitForSelector("#live.ok", { timeout: 10_000 });
    await page.waitForFunction(() => Number(document.body.dataset.updates) >= 2, null, { timeout: 10_000 });
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(overflow <= 1, `nothing overflows a narrow window (${overflow} px)`);
    await shot(page, "09-narrow");

    // 7. The page set off no console error, no failed request, nothing from another origin.
    await page.close();
    check(problems.length === 0, `no console errors and no failed requests${problems.length ? ":\n  " + problems.join("\n  ") : ""}`);
  } finally {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  }
  process.stdout.write("PASS\n");
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`[dashboard e2e] ${e.stack || e}\n`);
  if (problems.length) process.stderr.write(`[dashboard e2e] also seen:\n  ${problems.join("\n  ")}\n`);
  process.exit(1);
});
