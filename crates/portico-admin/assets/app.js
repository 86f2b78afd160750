// Portico's dashboard: plain ES modules, no build step. Reads the admin API of the address it is served from
// (docs/operations.md): /admin/series once, then /admin/events (one overview a second); the reload history and
// the running configuration when a reload happened. Everything from the server is put in the page as text.
import uPlot from "./vendor/uplot/uPlot.esm.js";

const WINDOW = 900;
const $ = (id) => document.getElementById(id);

const state = {
  t: [],                   // unix seconds of each step
  series: new Map(),       // "kind\u0000name" -> { kind, name, rps: [], eps: [], p50: [], p99: [] }
  scope: "total\u0000all",
  overview: null,
  reloadsSeen: -1,
  charts: {},
  token: sessionStorage.getItem("portico-admin-token"),
  lastUpdate: 0,
};

const keyOf = (kind, name) => kind + "\u0000" + name;

// ---------------------------------------------------------------- helpers

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmt(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en");
  return v.toFixed(v >= 100 ? 0 : digits);
}

const pct = (eps, rps) => (rps > 0 && eps !== null ? (100 * eps) / rps : (rps === 0 ? 0 : null));

function time(ms) {
  const d = new Date(ms);
  return d.toLocaleTimeString("en-GB", { hour12: false });
}

function dateTime(ms) {
  const d = new Date(ms);
  return d.toLocaleDateString("en-CA") + " " + d.toLocaleTimeString("en-GB", { hour12: false });
}

function setRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function notice(text, kind = "") {
  const n = $("notice");
  if (!text) { n.hidden = true; return; }
  n.textContent = text;
  n.className = "notice " + kind;
  n.hidden = false;
}

async function getJSON(path) {
  const r = await fetch(path, { headers: { accept: "application/json" } });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

// Mean of the last `n` non-null values of an array.
function recentMean(values, n = 5) {
  let sum = 0, count = 0;
  for (let i = values.length - 1; i >= 0 && count < n; i--) {
    if (values[i] !== null && values[i] !== undefined) { sum += values[i]; count++; }
  }
  return count ? sum / count : null;
}

// ---------------------------------------------------------------- series

function ensureSeries(kind, name) {
  const key = keyOf(kind, name);
  let s = state.series.get(key);
  if (!s) {
    const pad = () => new Array(state.t.length).fill(null);
    s = { kind, name, rps: pad(), eps: pad(), p50: pad(), p99: pad() };
    state.series.set(key, s);
  }
  return s;
}

function loadSeries(doc) {
  state.t = doc.t.slice();
  state.series.clear();
  for (const s of doc.series) {
    state.series.set(keyOf(s.kind, s.name), {
      kind: s.kind, name: s.name, rps: s.rps, eps: s.eps, p50: s.p50_ms, p99: s.p99_ms,
    });
  }
}

// Adds one overview's step to every series (a series the step does not name gets a gap).
function addStep(overview) {
  if (overview.t === null || overview.t === undefined) return;
  if (state.t.length && state.t[state.t.length - 1] >= overview.t) return;
  state.t.push(overview.t);
  const seen = new Set();
  for (const p of overview.series) {
    const s = ensureSeries(p.kind, p.name);
    seen.add(keyOf(p.kind, p.name));
    s.rps.push(p.rps); s.eps.push(p.eps); s.p50.push(p.p50_ms); s.p99.push(p.p99_ms);
  }
  for (const [key, s] of state.series) {
    if (!seen.has(key)) { s.rps.push(null); s.eps.push(null); s.p50.push(null); s.p99.push(null); }
  }
  if (state.t.length > WINDOW) {
    const cut = state.t.length - WINDOW;
    state.t.splice(0, cut);
    for (const s of state.series.values()) {
      for (const col of ["rps", "eps", "p50", "p99"]) s[col].splice(0, cut);
    }
  }
}

// ---------------------------------------------------------------- charts

function makeChart(id, series, yLabel) {
  const box = $(id);
  const width = Math.max(260, box.clientWidth);
  const opts = {
    width, height: 170,
    legend: { show: true, live: false },
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
    axes: [
      { stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6eb" } },
      { stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6eb" }, size: 50, label: yLabel, labelSize: 0 },
    ],
    series: [{}, ...series],
  };
  const data = [[], ...series.map(() => [])];
  const chart = new uPlot(opts, data, box);
  new ResizeObserver(() => {
    const w = Math.max(260, box.clientWidth);
    if (Math.abs(w - chart.width) > 2) chart.setSize({ width: w, height: 170 });
  }).observe(box);
  return chart;
}

function setupCharts() {
  state.charts.rps = makeChart("chart-rps", [
    { label: "requests/s", stroke: "#1f6feb", fill: "rgba(31,111,235,0.08)", width: 1.5, spanGaps: false },
    { label: "errors/s", stroke: "#cf222e", width: 1.5 },
  ]);
  state.charts.err = makeChart("chart-err", [
    { label: "5xx %", stroke: "#cf222e", fill: "rgba(207,34,46,0.08)", width: 1.5 },
  ]);
  state.charts.lat = makeChart("chart-lat", [
    { label: "p50", stroke: "#1a7f37", width: 1.5 },
    { label: "p99", stroke: "#9a6700", width: 1.5 },
  ]);
}

function drawCharts() {
  const s = state.series.get(state.scope);
  const t = state.t;
  const empty = () => new Array(t.length).fill(null);
  const rps = s ? s.rps : empty(), eps = s ? s.eps : empty();
  const err = rps.map((r, i) => (r === null ? null : pct(eps[i], r)));
  state.charts.rps.setData([t, rps, eps]);
  state.charts.err.setData([t, err]);
  state.charts.lat.setData([t, s ? s.p50 : empty(), s ? s.p99 : empty()]);
  const meanR = s ? recentMean(s.rps) : null, meanE = s ? recentMean(s.eps) : null;
  $("kpi-rps").textContent = fmt(meanR);
  const errPct = meanR === null ? null : pct(meanE, meanR);
  $("kpi-err").textContent = errPct === null ? "–" : fmt(errPct, 2) + " %";
  $("kpi-err").classList.toggle("bad", errPct !== null && errPct > 0);
  $("kpi-p50").textContent = s && recentMean(s.p50) !== null ? fmt(recentMean(s.p50), 2) + " ms" : "–";
  $("kpi-p99").textContent = s && recentMean(s.p99) !== null ? fmt(recentMean(s.p99), 2) + " ms" : "–";
}

// The series the charts can show, in the order the selector lists them.
const SCOPES = ["total", "listener", "route", "cluster", "endpoint", "function"];

function renderScopeSelect() {
  const select = $("scope");
  const wanted = [...state.series.values()]
    .filter((s) => SCOPES.includes(s.kind))
    .sort((a, b) => SCOPES.indexOf(a.kind) - SCOPES.indexOf(b.kind) || a.name.localeCompare(b.name));
  const keys = wanted.map((s) => keyOf(s.kind, s.name)).join("|");
  if (select.dataset.keys === keys) return;
  select.dataset.keys = keys;
  select.replaceChildren(...wanted.map((s) =>
    el("option", { value: keyOf(s.kind, s.name), text: s.kind === "total" ? "all routes" : `${s.kind}: ${s.name}` })));
  if (!state.series.has(state.scope)) state.scope = keyOf("total", "all");
  select.value = state.scope;
}

// ---------------------------------------------------------------- tables

function latestOf(kind, name) {
  const s = state.series.get(keyOf(kind, name));
  if (!s) return null;
  return { rps: recentMean(s.rps), eps: recentMean(s.eps), p50: recentMean(s.p50), p99: recentMean(s.p99) };
}

function renderRoutes() {
  const routes = [...state.series.values()].filter((s) => s.kind === "route").sort((a, b) => a.name.localeCompare(b.name));
  setRows($("routes").tBodies[0], routes.map((s) => {
    const l = latestOf("route", s.name);
    const key = keyOf("route", s.name);
    const e = l ? pct(l.eps, l.rps) : null;
    return el("tr", { class: "clickable" + (state.scope === key ? " selected" : ""), onclick: () => selectScope(key) },
      el("td", { text: s.name }),
      el("td", { class: "num", text: fmt(l?.rps) }),
      el("td", { class: "num", text: e === null ? "–" : fmt(e, 2) }),
      el("td", { class: "num", text: fmt(l?.p50, 2) }),
      el("td", { class: "num", text: fmt(l?.p99, 2) }));
  }));
}

function renderListeners(listeners) {
  setRows($("listeners").tBodies[0], (listeners || []).map((l) => {
    const key = keyOf("listener", l.name);
    // An HTTP listener has a series (its requests): its row selects it for the charts.
    const charted = state.series.has(key);
    const r = latestOf("listener", l.name);
    const e = r ? pct(r.eps, r.rps) : null;
    return el("tr", {
      class: (charted ? "clickable" : "") + (state.scope === key ? " selected" : ""),
      "data-listener": l.name,
      onclick: charted ? () => selectScope(key) : null,
    },
    el("td", { text: l.name }), el("td", { text: l.address }), el("td", { text: l.protocol + (l.tls ? " + TLS" : "") }),
    el("td", { class: "num", text: fmt(r?.rps) }),
    el("td", { class: "num", text: e === null ? "–" : fmt(e, 2) }),
    el("td", { class: "num", text: fmt(r?.p99, 2) }),
    el("td", { class: "num", text: l.tls_handshakes }), el("td", { class: "num", text: l.tls_failures }),
    el("td", { class: "num", text: l.evicted }), el("td", { class: "num", text: l.panics }));
  }));
}

function endpointState(e) {
  if (e.drained) return ["drained", "drained"];
  if (!e.healthy) return ["down", "down"];
  if (e.ejected) return ["ejected", `ejected ${Math.ceil(e.ejected_for_ms / 1000)} s`];
  return ["ok", "healthy"];
}

function renderClusters(clusters) {
  const list = $("cluster-list");
  const previous = state.previousClusters || new Map();
  const now = new Map();
  list.replaceChildren(...(clusters || []).map((c) => {
    const before = previous.get(c.name);
    now.set(c.name, c);
    const rejecting = before && c.breaker_rejections > before.breaker_rejections;
    const breaker = c.breaker === "open" || rejecting ? ["bad", "breaker open"] : ["ok", "breaker closed"];
    const totals = latestOf("cluster", c.name);
    const limits = c.breaker_limits || {};
    const head = el("div", { class: "cluster-head" },
      el("span", { class: "name", text: c.name }),
      el("span", { class: "pill " + breaker[0], text: breaker[1] }),
      el("span", { class: "facts" },
        el("span", {}, "req/s ", el("b", { text: fmt(totals?.rps) })),
        el("span", {}, "err % ", el("b", { text: totals ? fmt(pct(totals.eps, totals.rps), 2) : "–" })),
        el("span", {}, "in flight ", el("b", { text: `${c.requests_active}` }), limits.max_requests ? ` / ${limits.max_requests}` : ""),
        el("span", {}, "pending ", el("b", { text: `${c.requests_pending}` })),
        el("span", {}, "connections ", el("b", { text: `${c.connections_open}` }), limits.max_connections ? ` / ${limits.max_connections}` : ""),
        el("span", {}, "breaker rejections ", el("b", { text: `${c.breaker_rejections}` })),
        el("span", {}, "no endpoint ", el("b", { text: `${c.no_healthy_endpoint}` })),
        el("span", {}, "retries ", el("b", { text: `${c.retries}` })),
        el("span", { text: c.health_check ? `health check every ${c.health_check_interval_ms / 1000} s` : "no health check" }),
        c.panic_mode ? el("span", { text: "panic mode" }) : null));
    const rows = c.endpoints.map((e) => {
      const [cls, label] = endpointState(e);
      const l = latestOf("endpoint", `${c.name}/${e.address}`);
      const action = e.drained
        ? el("button", { type: "button", class: "small", text: "Enable", "data-action": "enable", onclick: () => endpointAction("enable", c.name, e.address) })
        : el("button", { type: "button", class: "small ghost", text: "Drain", "data-action": "drain", onclick: () => endpointAction("drain", c.name, e.address) });
      return el("tr", { class: "endpoint " + cls, "data-endpoint": e.address, "data-state": cls },
        el("td", {}, el("span", { class: "pill " + cls, text: label })),
        el("td", { text: e.address + (e.resolved !== e.address ? ` (${e.resolved})` : "") }),
        el("td", { class: "num", text: e.weight }),
        el("td", { class: "num", text: e.in_flight }),
        el("td", { class: "num", text: e.idle_connections }),
        el("td", { class: "num", text: fmt(l?.rps) }),
        el("td", { class: "num", text: l ? fmt(pct(l.eps, l.rps), 2) : "–" }),
        el("td", { class: "num", text: fmt(l?.p99, 2) }),
        el("td", { class: "num", text: e.requests }),
        el("td", { class: "num", text: e.failures }),
        el("td", { class: "num", text: e.ejections }),
        el("td", {}, action));
    });
    const table = el("table", { class: "endpoints" },
      el("thead", {}, el("tr", {}, ...["state", "endpoint", "weight", "in flight", "idle conns", "req/s", "err %", "p99 ms", "responses", "failures", "ejections", ""]
        .map((h, i) => el("th", { class: i >= 2 && i <= 10 ? "num" : null, text: h })))),
      el("tbody", {}, ...rows));
    return el("div", { class: "cluster", "data-cluster": c.name }, head, table);
  }));
  state.previousClusters = now;
}

function renderErrors(errors) {
  const list = errors || [];
  $("errors-empty").hidden = list.length > 0;
  setRows($("error-list").tBodies[0], list.map((e) => el("tr", {},
    el("td", { text: time(e.at_ms) }),
    el("td", {}, el("span", { class: "pill bad", text: e.status })),
    el("td", { class: "wrap", text: e.reason }),
    el("td", { text: e.route }), el("td", { text: e.cluster }), el("td", { text: e.endpoint || "–" }),
    el("td", { class: "wrap", text: `${e.method} ${e.path}` }))));
}

function renderFunctions(functions) {
  const show = Array.isArray(functions) && functions.length > 0;
  $("functions").hidden = !show;
  $("nav-functions").hidden = !show;
  if (!show) return;
  setRows($("function-list").tBodies[0], functions.map((f) => {
    const errors = Object.entries(f.errors).filter(([, n]) => n > 0);
    const total = errors.reduce((a, [, n]) => a + n, 0);
    const l = latestOf("function", f.name);
    return el("tr", {},
      el("td", { text: f.name }), el("td", { class: "num", text: fmt(l?.rps) }),
      el("td", { class: "num", text: f.invocations }), el("td", { class: "num", text: total }),
      el("td", { text: errors.map(([k, n]) => `${k} ${n}`).join(", ") || "–" }),
      el("td", { class: "num", text: f.runtimes_created }), el("td", { class: "num", text: fmt(f.cpu_seconds, 3) }));
  }));
}

function renderMqtt(mqtt) {
  const show = !!mqtt;
  $("mqtt").hidden = !show;
  $("nav-mqtt").hidden = !show;
  if (!show) return;
  $("mqtt-connections").textContent = mqtt.connections;
  $("mqtt-sessions").textContent = mqtt.sessions;
  $("mqtt-subscriptions").textContent = mqtt.subscriptions;
  $("mqtt-retained").textContent = mqtt.retained_messages;
  const received = latestOf("mqtt", "received"), sent = latestOf("mqtt", "sent");
  $("mqtt-in").textContent = fmt(received?.rps);
  $("mqtt-out").textContent = fmt(sent?.rps);
  $("mqtt-dropped").textContent = fmt(received?.eps);
}

function diffView(text) {
  const pre = el("pre", { class: "diff" });
  for (const line of text.split("\n")) {
    const cls = line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : null;
    pre.append(el("span", { class: cls, text: line + "\n" }));
  }
  return pre;
}

async function renderReloads() {
  try {
    const [history, config] = await Promise.all([getJSON("/admin/reloads"), getJSON("/admin/config")]);
    $("reloads-empty").hidden = history.reloads.length > 0;
    setRows($("reload-list").tBodies[0], history.reloads.map((r) => {
      const details = [];
      if (r.changes.length) details.push(el("ul", { class: "changes" }, ...r.changes.map((c) => el("li", { text: c }))));
      if (r.error) details.push(el("pre", { class: "error", text: r.error }));
      if (r.diff) details.push(el("details", {}, el("summary", { text: r.ok ? "diff" : "diff of the refused file" }), diffView(r.diff)));
      if (!details.length) details.push(el("span", { class: "muted", text: "no change" }));
      return el("tr", { "data-reload": String(r.id), "data-ok": String(r.ok) },
        el("td", { text: dateTime(r.at_ms) }), el("td", { text: r.trigger }),
        el("td", {}, el("span", { class: "pill " + (r.ok ? "ok" : "bad"), text: r.ok ? "applied" : "refused" })),
        el("td", { class: "wrap" }, ...details));
    }));
    $("config-text").textContent = config.yaml;
    $("config-file").textContent = config.file;
  } catch (e) {
    notice(`cannot read the reload history: ${e.message}`, "bad");
  }
}

// ---------------------------------------------------------------- actions

function askToken() {
  return new Promise((resolve) => {
    const dialog = $("token-dialog");
    $("token-input").value = "";
    const done = (value) => {
      dialog.close();
      $("token-form").onsubmit = null;
      $("token-cancel").onclick = null;
      resolve(value);
    };
    $("token-form").onsubmit = (ev) => { ev.preventDefault(); done($("token-input").value.trim() || null); };
    $("token-cancel").onclick = () => done(null);
    dialog.showModal();
  });
}

// POSTs an action with the admin token when one is needed (asked once, kept for this tab).
async function post(path, body) {
  for (let attempt = 0; attempt < 2; attempt++) {
    if (state.overview?.token_required && !state.token) {
      state.token = await askToken();
      if (!state.token) return { ok: false, error: "no admin token given" };
      sessionStorage.setItem("portico-admin-token", state.token);
    }
    const headers = { "content-type": "application/json" };
    if (state.token) headers.authorization = "Bearer " + state.token;
    const r = await fetch(path, { method: "POST", headers, body: body ? JSON.stringify(body) : "" });
    const answer = await r.json().catch(() => ({ ok: false, error: `${r.status}` }));
    if (r.status === 401) {
      // A wrong or missing token: ask again once.
      state.token = null;
      sessionStorage.removeItem("portico-admin-token");
      if (state.overview) state.overview.token_required = true;
      if (attempt === 0) { notice(answer.error || "the admin token was refused", "bad"); continue; }
    }
    return { ok: r.ok && answer.ok !== false, status: r.status, ...answer };
  }
  return { ok: false, error: "the admin token was refused" };
}

async function endpointAction(action, cluster, endpoint) {
  const r = await post(`/admin/endpoints/${action}`, { cluster, endpoint });
  notice(r.ok ? `${endpoint} in ${cluster}: ${action === "drain" ? "drained" : "enabled again"}` : `${action} refused: ${r.error}`, r.ok ? "good" : "bad");
  refreshOverview();
}

async function reloadNow() {
  $("reload-button").disabled = true;
  const r = await post("/admin/reload");
  $("reload-button").disabled = false;
  notice(r.ok ? "configuration reloaded" : `reload refused: ${r.error}`, r.ok ? "good" : "bad");
  refreshOverview();
}

function selectScope(key) {
  state.scope = key;
  $("scope").value = key;
  drawCharts();
  renderRoutes();
  renderListeners(state.overview?.listeners);
}

// ---------------------------------------------------------------- live

function render(overview) {
  state.overview = overview;
  $("process").textContent = `pid ${overview.process.pid} · ${overview.process.version}` + (overview.ready ? "" : " · not ready");
  $("token-button").hidden = !overview.token_required;
  // Read-only by default: the page acts only where an admin token is configured (the API itself takes
  // state-changing requests without one when none is configured, as scripts expect).
  document.body.classList.toggle("read-only", !overview.token_required);
  $("read-only").hidden = overview.token_required;
  $("reload-button").hidden = !overview.reload_available;
  $("token-button").textContent = state.token ? "admin token set" : "admin token";
  renderScopeSelect();
  drawCharts();
  renderRoutes();
  renderListeners(overview.listeners);
  renderClusters(overview.clusters);
  renderErrors(overview.errors);
  renderFunctions(overview.functions);
  renderMqtt(overview.mqtt);
  if (overview.reloads.last_id !== state.reloadsSeen) {
    state.reloadsSeen = overview.reloads.last_id;
    renderReloads();
  }
  state.lastUpdate = Date.now();
  // Steps charted and updates taken: what an end-to-end test (or a curious operator) can read off the page.
  document.body.dataset.steps = String(state.t.length);
  document.body.dataset.updates = String((Number(document.body.dataset.updates) || 0) + 1);
}

async function refreshOverview() {
  try { render(await getJSON("/admin/overview")); } catch (e) { notice(e.message, "bad"); }
}

function live() {
  const source = new EventSource("/admin/events");
  const pill = $("live");
  source.onopen = () => { pill.textContent = "live"; pill.className = "pill ok"; };
  source.onmessage = (ev) => {
    const overview = JSON.parse(ev.data);
    addStep(overview);
    render(overview);
  };
  source.onerror = () => { pill.textContent = "reconnecting"; pill.className = "pill warn"; };
}

async function start() {
  setupCharts();
  $("scope").addEventListener("change", (ev) => selectScope(ev.target.value));
  $("reload-button").addEventListener("click", reloadNow);
  $("token-button").addEventListener("click", async () => {
    const token = await askToken();
    if (token) { state.token = token; sessionStorage.setItem("portico-admin-token", token); }
    if (state.overview) render(state.overview);
  });
  try {
    loadSeries(await getJSON("/admin/series"));
  } catch (e) {
    notice(`cannot read the series: ${e.message}`, "bad");
  }
  await refreshOverview();
  live();
}

start();
