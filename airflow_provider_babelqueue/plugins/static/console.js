// The dead-letter console page: plain DOM code over /babelqueue/console/api (no framework, no build step).
// Every value that comes from a message is put in the page as text (textContent), never as markup.
"use strict";

const API = "api";
const state = { start: 0, next: null, entries: [], jobsTimer: null, connections: [] };

function $(id) { return document.getElementById(id); }

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

function say(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function call(path, options) {
  const answer = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
  const type = answer.headers.get("content-type") || "";
  const body = type.includes("json") ? await answer.json() : await answer.text();
  if (!answer.ok) {
    const detail = body && body.detail ? body.detail : body;
    throw new Error(`${answer.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return body;
}

function where() {
  return { conn_id: $("conn").value, queue_name: $("queue").value.trim() };
}

const FILTERS = ["reason", "urn", "exception_type", "fingerprint", "lang", "original_queue", "text"];

function filters() {
  const out = {};
  for (const name of FILTERS.filter((n) => n !== "text")) {
    const value = $(name).value.trim();
    if (value) out[name] = value.split(",").map((part) => part.trim()).filter(Boolean);
  }
  const text = $("text").value.trim();
  if (text) out.text = text;
  return out;
}

function query(extra) {
  const params = new URLSearchParams(where());
  for (const [name, value] of Object.entries(Object.assign(filters(), extra || {}))) {
    for (const item of [].concat(value)) params.append(name, item);
  }
  return params.toString();
}

async function loadConnections() {
  const { connections } = await call(`${API}/connections`);
  const select = $("conn");
  select.replaceChildren(...connections.map((c) => el("option", `${c.conn_id} (${c.conn_type})`, { value: c.conn_id })));
  // the page's state lives in the URL's fragment (connection, queue, filters, the open dead letter), so a view
  // can be shared as a link; it never holds an action
  const saved = new URLSearchParams(location.hash.slice(1));
  const named = saved.get("conn_id");
  if (named && !connections.some((c) => c.conn_id === named)) select.append(el("option", named, { value: named }));
  if (named) select.value = named;
  if (saved.get("queue_name")) $("queue").value = saved.get("queue_name");
  for (const name of FILTERS) if (saved.get(name)) $(name).value = saved.get(name);
  state.connections = connections;
  return saved.get("open");
}

function lastHour(row) {
  return row.dead_letters_last_hour === null ? "—"
    : `${row.dead_letters_last_hour_whole ? "" : "≥ "}${row.dead_letters_last_hour}`;
}

async function loadOverview(connections) {
  // every connection's known queues, each connection answering on its own (a slow broker delays only its rows)
  const body = $("overview");
  for (const old of body.querySelectorAll("tbody")) old.remove();
  await Promise.all(connections.map(async (c) => {
    const group = el("tbody", null, { "data-conn": c.conn_id });
    body.append(group);
    try {
      const answer = await call(`${API}/queues?${new URLSearchParams({ conn_id: c.conn_id })}`);
      if (!answer.queues.length) {
        const why = answer.listed === null ? "this broker cannot list its queues: set the connection's console_queues extra, or name a queue above"
          : "no queue holds messages or dead letters";
        const row = el("tr");
        row.append(el("td", c.conn_id), el("td", why, { colspan: "5" }));
        group.append(row);
      }
      for (const q of answer.queues) {
        const row = el("tr", null, { class: "entry" });
        const oldest = q.oldest_failed_at ? new Date(q.oldest_failed_at).toISOString() : "—";
        row.append(el("td", c.conn_id), el("td", q.queue_name), el("td", q.depth), el("td", q.dead_letter_depth),
          el("td", lastHour(q)), el("td", oldest));
        row.addEventListener("click", () => {
          $("conn").value = c.conn_id;
          $("queue").value = q.queue_name;
          loadPage(0);
        });
        group.append(row);
      }
    } catch (error) {
      const row = el("tr");
      row.append(el("td", c.conn_id), el("td", String(error.message || error), { colspan: "5", class: "error" }));
      group.append(row);
    }
  }));
}

async function loadDepths() {
  const { queues } = await call(`${API}/queues?${new URLSearchParams(Object.assign(where()))}`);
  const row = queues[0];
  const oldest = row.oldest_failed_at ? new Date(row.oldest_failed_at).toISOString() : "—";
  const hour = row.dead_letters_last_hour === null ? "not known on this broker" : lastHour(row);
  $("depths").replaceChildren(el("span", `ready: ${row.depth}`), el("span", `dead letters: ${row.dead_letter_depth}`),
    el("span", `last hour: ${hour}`), el("span", `sources: ${row.dead_letter_sources.join(", ")}`),
    el("span", `oldest failure: ${oldest}`));
}

function renderEntries(page) {
  const body = $("entries");
  body.replaceChildren();
  for (const entry of page.entries) {
    const row = el("tr", null, { class: "entry", "data-position": entry.position });
    const box = el("input", null, { type: "checkbox", "data-position": entry.position });
    box.addEventListener("click", (event) => event.stopPropagation());
    const pick = el("td");
    pick.append(box);
    row.append(pick, el("td", entry.position),
      el("td", entry.failed_at ? new Date(entry.failed_at).toISOString() : "—"), el("td", entry.reason),
      el("td", entry.urn || "—"), el("td", entry.exception_type || "—"),
      el("td", entry.error || "", { class: "error" }), el("td", entry.fingerprint), el("td", entry.meta_id || "—"));
    row.addEventListener("click", () => openEntry(entry.position));
    body.append(row);
  }
  const more = page.next_position === null ? "end of the queue" : `next from position ${page.next_position}`;
  const stop = page.stopped_by ? ` (stopped by ${page.stopped_by})` : "";
  say(`${page.entries.length} shown, ${page.scanned} read from position ${state.start}; ${more}${stop}`);
}

async function loadPage(start) {
  state.start = start;
  remember();
  try {
    await loadDepths();
    const page = await call(`${API}/dead-letters?${query({ start, limit: 50 })}`);
    state.next = page.next_position;
    state.entries = page.entries;
    renderEntries(page);
  } catch (error) {
    say(String(error.message || error), true);
  }
}

function remember(open) {
  const params = new URLSearchParams(where());
  for (const name of FILTERS) if ($(name).value.trim()) params.set(name, $(name).value.trim());
  if (open !== undefined) params.set("open", open);
  history.replaceState(null, "", `#${params}`);
}

async function openEntry(position) {
  remember(position);
  try {
    const one = await call(`${API}/dead-letters/${position}?${new URLSearchParams(where())}`);
    $("detail-title").textContent = `Dead letter at position ${position}`;
    $("detail-facts").textContent = JSON.stringify(one.entry, null, 2);
    $("detail-block").textContent = JSON.stringify(one.dead_letter, null, 2);
    $("detail-headers").textContent = JSON.stringify(one.headers, null, 2);
    $("detail-body").textContent = one.body_text !== null ? one.body_text : `hex: ${one.body_hex}`;
    $("detail").hidden = false;
  } catch (error) {
    say(String(error.message || error), true);
  }
}

function selection() {
  const boxes = [...document.querySelectorAll("#entries input[type=checkbox]:checked")];
  const positions = boxes.map((box) => Number(box.getAttribute("data-position")));
  const byPosition = new Map(state.entries.map((entry) => [entry.position, entry]));
  if (positions.length) {
    return Object.assign(where(), { positions, meta_ids: positions.map((p) => byPosition.get(p).meta_id) });
  }
  // everything matching the filters: the whole queue is read, so the action runs as a job outside the request
  return Object.assign(where(), { filter: filters(), background: true });
}

async function act(path, body, describe, refresh) {
  // refresh, when given, redraws what the action changed before the status says it is done
  try {
    const answer = await call(`${API}/actions/${path}`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    $("result").textContent = typeof answer === "string" ? answer : JSON.stringify(answer, null, 2);
    if (answer && answer.job) {
      say(`job ${answer.job.id} started: ${answer.job.action} of everything matching the filters; progress below`);
      await loadJobs();
      return null;
    }
    if (refresh) await refresh();
    await loadActions();
    say(describe(answer));
    return answer;
  } catch (error) {
    say(String(error.message || error), true);
    return null;
  }
}

async function loadActions() {
  const { actions } = await call(`${API}/actions?limit=20`);
  $("actions").replaceChildren(...actions.map((a) => {
    const row = el("tr");
    row.append(el("td", a.when), el("td", a.who), el("td", a.action), el("td", JSON.stringify(a.details)));
    return row;
  }));
}

function jobProgress(job) {
  const counts = Object.entries(job.counts).filter(([, v]) => typeof v === "number")
    .map(([k, v]) => `${k} ${v}`).join(", ");
  return `read ${job.scanned} of ${job.depth}, matched ${job.matched}${counts ? "; " + counts : ""}`;
}

async function loadJobs() {
  clearTimeout(state.jobsTimer);
  const { jobs } = await call(`${API}/jobs?limit=10`);
  $("jobs").replaceChildren(...jobs.map((job) => {
    const row = el("tr", null, { "data-job": job.id });
    const shown = job.stalled ? "stalled (its API server stopped; run it again)" : job.state;
    const tools = el("td");
    if (job.state === "running") {
      const stop = el("button", "Cancel");
      stop.addEventListener("click", () => call(`${API}/jobs/${job.id}/cancel`, { method: "POST" })
        .then(loadJobs, (error) => say(String(error.message || error), true)));
      tools.append(stop);
    } else if (job.action === "export" && job.state === "succeeded") {
      tools.append(el("a", "Download", { href: `${API}/jobs/${job.id}/file` }));
    }
    row.append(el("td", new Date(job.started_at * 1000).toISOString()), el("td", job.who), el("td", job.action),
      el("td", `${job.conn_id} / ${job.queue_name}`), el("td", shown, { class: "state" }),
      el("td", jobProgress(job) + (job.error ? ` — ${job.error}` : ""), { class: "progress" }), tools);
    return row;
  }));
  if (jobs.some((job) => job.state === "running" && !job.stalled)) {
    state.jobsTimer = setTimeout(() => loadJobs().catch((error) => say(String(error.message || error), true)), 1000);
  } else {
    await loadActions();
  }
}

async function loadReports() {
  const { reports } = await call("../reports?limit=20");
  $("reports").replaceChildren(...reports.map((r) => {
    const item = el("li");
    item.append(el("a", `${r.dag_id} / ${r.run_id} / ${r.task_id}`, { href: r.url, target: "_blank", rel: "noopener" }),
      el("span", ` (${r.when})`));
    return item;
  }));
  if (!reports.length) $("reports").replaceChildren(el("li", "none yet: a triage task with report_output writes one"));
}

function replayOptions() {
  // where the ledger lives, where the messages go, how fast: empty fields keep the replay engine's defaults
  const out = {};
  const ledger = $("ledger").value.trim();
  const target = $("target").value.trim();
  const rate = Number($("rate").value);
  if (ledger) out.ledger_conn_id = ledger;
  if (target) out.target_queue_name = target;
  if ($("rate").value.trim() && rate > 0) out.max_messages_per_second = rate;
  return out;
}

function wire() {
  $("load").addEventListener("click", () => loadPage(0));
  $("next").addEventListener("click", () => { if (state.next !== null) loadPage(state.next); });
  $("preview").addEventListener("click", () => act("replay", Object.assign(selection(), replayOptions(), { dry_run: true }),
    (a) => `preview: ${a.replayed} would be replayed to ${JSON.stringify(a.targets)}; skipped ${JSON.stringify(a.skipped)}`));
  $("replay").addEventListener("click", () => act("replay", Object.assign(selection(), replayOptions(), { dry_run: false }),
    (a) => `replayed ${a.replayed}; ${a.duplicates_avoided} already replayed before` +
      (a.ledgers.length ? ` (ledger ${a.ledgers.join(", ")})` : "")));
  $("export").addEventListener("click", () => act("export", selection(), (text) => `exported ${text.split("\n").filter(Boolean).length} drain records`));
  $("discard").addEventListener("click", async () => {
    const body = selection();
    const what = body.filter ? "every dead letter matching the filters (as a background job)" : "the selected dead letters";
    if (!window.confirm(`Archive ${what} as drain records, then remove them from the queue?`)) return;
    // the rows moved up: the queue is shown as it is now before the status says what was done
    await act("discard", body, (a) => `archived ${a.archived} in ${a.archive}; removed ${a.discarded}`,
      () => loadPage(state.start));
  });
}

document.addEventListener("DOMContentLoaded", async () => {
  wire();
  try {
    const open = await loadConnections();
    loadOverview(state.connections);  // not awaited: the queue named in the link loads meanwhile
    await loadActions();
    await loadJobs();
    await loadReports();
    if ($("queue").value) {
      await loadPage(0);
      if (open !== null) await openEntry(Number(open));
    } else {
      say("Pick a queue in the overview, or a connection and a queue name, then Load.");
    }
  } catch (error) {
    say(String(error.message || error), true);
  }
});
