// The live page of a Reef gateway: polls the gateway's own JSON routes and draws what they say.
// Plain browser script, no build step, no other origin (the page's Content-Security-Policy allows
// none). Everything that comes from records (replies, next states, hints, scenario names) is
// attacker-controlled text: it reaches the page only through textContent and setAttribute, never
// through innerHTML, so a hint holding markup stays text.
'use strict';

const POLL_MS = 5000;
const SVG_NS = 'http://www.w3.org/2000/svg';
const KEY_SLOT = 'reef.api_key';

// The key lives in sessionStorage and travels only in the Authorization header. Not in the URL:
// URLs end up in history, logs, bookmarks and Referer headers. Not in a cookie: a browser sends
// cookies by itself with requests other sites make to the gateway, and the gateway's defence
// against those pages (browser-guard.ts) is that a page on another origin holds no key.
// sessionStorage is this origin's and this tab's alone, and goes when the tab closes.
function storedKey() {
  try {
    return sessionStorage.getItem(KEY_SLOT);
  } catch {
    return null;
  }
}

const state = { me: null, scenario: null, polls: 0, timer: null, releasesShown: [] };

const $ = (id) => document.getElementById(id);

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

class HttpError extends Error {
  constructor(status, message, retryAfter) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

async function api(path, init) {
  const headers = { accept: 'application/json', ...((init && init.headers) || {}) };
  const key = storedKey();
  if (key) headers.authorization = `Bearer ${key}`;
  const res = await fetch(path, { ...init, headers, credentials: 'omit', cache: 'no-store' });
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!res.ok) {
    const message = (body && body.error && body.error.message) || `${res.status} ${res.statusText}`;
    throw new HttpError(res.status, message, Number(res.headers.get('retry-after')) || null);
  }
  return body;
}

const enc = encodeURIComponent;
const fmtTime = (ms) => (typeof ms === 'number' ? new Date(ms).toLocaleString() : '');
// Three significant digits: a learning rate of 1e-5 must not read 0.000.
const fmtNum = (n) => {
  if (typeof n !== 'number') return String(n);
  if (Number.isInteger(n) || !Number.isFinite(n)) return String(n);
  if (Math.abs(n) >= 1000) return n.toFixed(0);
  return Math.abs(n) < 1e-3 ? n.toExponential(2) : n.toPrecision(3);
};

function row(...cells) {
  const tr = el('tr', {});
  tr.append(...cells);
  return tr;
}

function fillCounters(dl, entries) {
  dl.replaceChildren();
  for (const [k, v] of entries) {
    dl.append(el('dt', {}, k), el('dd', {}, v));
  }
}

// --- charts ---------------------------------------------------------------------------------

const CHART = { w: 640, h: 220, left: 40, right: 12, top: 12, bottom: 26 };

/** One curve: the rolling mean as a line, each turn's own value as a dot, releases as dashed lines. */
function drawChart(node, kind, points, range, releases) {
  const { w, h, left, right, top, bottom } = CHART;
  const pw = w - left - right;
  const ph = h - top - bottom;
  const [lo, hi] = range;
  const n = points.length;
  const x = (i) => left + (n <= 1 ? pw / 2 : (i / (n - 1)) * pw);
  const y = (v) => top + (1 - (v - lo) / (hi - lo)) * ph;
  node.replaceChildren();
  const g = svg('g', { class: kind });
  for (const t of [lo, (lo + hi) / 2, hi]) {
    g.append(svg('line', { class: 'grid', x1: left, x2: left + pw, y1: y(t), y2: y(t) }));
    const label = svg('text', { class: 'label', x: left - 6, y: y(t) + 4, 'text-anchor': 'end' });
    label.textContent = kind === 'habit' ? `${Math.round(t * 100)}%` : fmtNum(t);
    g.append(label);
  }
  g.append(svg('line', { class: 'axis', x1: left, x2: left + pw, y1: top + ph, y2: top + ph }));
  const xl = svg('text', { class: 'label', x: left + pw / 2, y: h - 6, 'text-anchor': 'middle' });
  xl.textContent = n === 0 ? 'no judged turns yet' : `judged turns 1–${n}`;
  g.append(xl);
  // A release trained on the turns before it: its line stands before the first turn judged after it.
  for (const r of releases) {
    const i = points.findIndex((p) => p.at >= r.createdAt);
    if (i < 0) continue;
    const rx = n <= 1 ? x(0) : x(i) - (i > 0 ? (x(i) - x(i - 1)) / 2 : 0);
    g.append(svg('line', { class: 'release', x1: rx, x2: rx, y1: top, y2: top + ph }));
    const t = svg('text', { class: 'release-label', x: rx + 3, y: top + 10 });
    t.textContent = r.weightVersion;
    g.append(t);
  }
  for (const [i, p] of points.entries()) g.append(svg('circle', { class: 'raw', cx: x(i), cy: y(p.value), r: 2 }));
  if (n > 0) g.append(svg('polyline', { class: 'rolling', points: points.map((p, i) => `${x(i).toFixed(1)},${y(p.rolling).toFixed(1)}`).join(' ') }));
  node.append(g);
}

// --- panels ---------------------------------------------------------------------------------

function voteText(votes) {
  return votes.map((v) => (v === null ? '?' : v > 0 ? `+${v}` : String(v))).join(' ') || '—';
}

function renderTurns(turns) {
  const list = $('turns');
  list.replaceChildren();
  if (turns.length === 0) list.append(el('li', { class: 'muted' }, 'No judged turns in this scenario yet.'));
  for (const t of turns) {
    const li = el('li', { 'data-offset': t.offset });
    const head = el('div', { class: 'turn-head' });
    const rewardClass = t.reward > 0 ? 'reward-pos' : t.reward < 0 ? 'reward-neg' : 'reward-zero';
    head.append(
      el('span', { class: rewardClass }, `reward ${t.reward > 0 ? '+' : ''}${t.reward}`),
      el('span', {}, t.decision),
      el('span', {}, `score votes ${voteText(t.votes.score)}`),
      el('span', {}, `hint votes ${voteText(t.votes.hint)}`),
      el('span', {}, fmtTime(t.createdAt)),
      el('span', { class: 'muted' }, t.sessionKey),
    );
    for (const h of t.habits) head.append(el('span', { class: 'habit-tag' }, h));
    li.append(head);
    if (t.reply !== null) li.append(el('div', { class: 'text reply' }, t.reply));
    if (t.nextState !== null) li.append(el('div', { class: 'text next' }, `${t.nextState.role}: ${t.nextState.content}`));
    for (const h of t.hints) li.append(el('div', { class: 'hint' }, `hint: ${h}`));
    list.append(li);
  }
}

const CORRELATION = [
  ['bound', 'bound turns'],
  ['dropped_unbound', 'unbound (expired, evicted, no next state)'],
  ['evicted', 'sessions evicted'],
  ['ended', 'sessions ended by the client'],
  ['tagged', 'tagged requests'],
  ['untagged', 'untagged requests'],
  ['retries', 'retries'],
  ['side', 'side requests'],
];

function renderStatus(status) {
  const c = status.correlation || {};
  fillCounters($('correlation'), CORRELATION.map(([k, label]) => [label, c[k] ?? 0]));
  const warnings = $('warnings');
  warnings.replaceChildren();
  for (const w of status.correlationWarnings || []) warnings.append(el('li', { 'data-code': w.code }, `${w.code}: ${w.message}`));
  const gw = status.gateway || {};
  fillCounters($('gateway'), [
    ['weights served', gw.weightVersion ?? 'base'],
    ['generation', gw.paused ? 'paused (weight swap)' : 'running'],
    ['in flight', gw.inflight ?? 0],
    ['records stored', (status.store && status.store.records) ?? 0],
  ]);
  const t = status.training || {};
  fillCounters($('training'), [['releases', t.releases ?? 0], ['weights', t.weightVersion ?? 'base'], ...Object.entries(t.counters || {})]);
  fillCounters($('judge'), Object.entries(status.judge || {}));
  const actors = $('actors').tBodies[0];
  actors.replaceChildren();
  const list = Array.isArray(status.actors) ? status.actors : [];
  if (list.length === 0) actors.append(row(el('td', { colspan: 4, class: 'muted' }, 'not running under reef up')));
  for (const a of list) {
    const tr = el('tr', {});
    tr.append(el('td', {}, a.id), el('td', {}, a.state), el('td', {}, a.restarts), el('td', {}, a.lastExit ?? ''));
    actors.append(tr);
  }
  const engines = $('engines');
  engines.replaceChildren();
  for (const e of Array.isArray(status.engines) ? status.engines : []) {
    const name = e.name || e.role || e.id || 'engine';
    const rest = Object.entries(e).filter(([k, v]) => k !== 'name' && v !== null && typeof v !== 'object').map(([k, v]) => `${k} ${v}`);
    engines.append(el('li', {}, `${name}: ${rest.join(', ')}`));
  }
}

function renderReleases(releases) {
  state.releasesShown = releases;
  const body = $('releases').tBodies[0];
  body.replaceChildren();
  if (releases.length === 0) body.append(row(el('td', { colspan: 5, class: 'muted' }, 'No releases yet.')));
  for (const [i, r] of releases.entries()) {
    const tr = el('tr', { 'data-release': r.id });
    const what = r.rollbackOf ? `${r.id} (rollback to ${r.rollbackOf}${r.keyId ? `, key ${r.keyId}` : ''})` : `${r.id} (${(r.batchIds || []).length} batch${(r.batchIds || []).length === 1 ? '' : 'es'})`;
    const metrics = Object.entries(r.metrics || {}).map(([k, v]) => `${k} ${fmtNum(v)}`).join(', ');
    tr.append(el('td', {}, what), el('td', {}, r.weightVersion), el('td', {}, fmtTime(r.createdAt)), el('td', {}, metrics));
    const cell = el('td', {});
    // The newest release is what is served: only an older one can be rolled back to.
    if (state.me && state.me.rollback && i > 0) {
      const button = el('button', { type: 'button', class: 'rollback', 'data-release': r.id }, 'Roll back to this');
      button.addEventListener('click', () => rollback(r));
      cell.append(button);
    }
    tr.append(cell);
    body.append(tr);
  }
}

async function rollback(release) {
  // The weights are every scenario's: say so before anything is sent.
  if (!window.confirm(`Roll the served weights of every scenario back to ${release.id} (${release.weightVersion})?`)) return;
  const out = $('rollback-result');
  out.textContent = `rolling back to ${release.id}…`;
  try {
    const result = await api(`/reef/scenarios/${enc(state.scenario)}/releases/rollback`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ release_id: release.id }),
    });
    out.textContent = `rolled back to ${release.id}${result && result.id ? ` (new release ${result.id})` : ''}`;
  } catch (err) {
    out.textContent = `rollback refused: ${err.message}`;
  }
  schedule(0);
}

// --- polling --------------------------------------------------------------------------------

function showError(message) {
  const p = $('error');
  p.hidden = message === null;
  p.textContent = message ?? '';
}

function askForKey(message) {
  state.me = null;
  $('key-form').hidden = false;
  $('key-error').textContent = message ?? '';
  $('key').focus();
}

function fillScenarios(list) {
  const select = $('scenario');
  const names = list.map((s) => s.name);
  if (state.scenario === null || !names.includes(state.scenario)) {
    // A link may name the scenario (/reef/ui#homework); it is only ever compared with the names
    // the gateway listed, never put in a page or a request as it is.
    let linked = null;
    try {
      linked = decodeURIComponent(location.hash.slice(1));
    } catch {
      // A malformed escape names no scenario.
    }
    state.scenario = names.includes(linked) ? linked : names.includes('default') ? 'default' : (names[0] ?? null);
  }
  const shown = [...select.options].map((o) => o.value);
  if (shown.join('\n') !== names.join('\n')) {
    select.replaceChildren(...names.map((n) => el('option', { value: n }, n)));
  }
  if (state.scenario !== null) select.value = state.scenario;
}

/** One round of requests; answers when to poll next (ms), or null to wait for a key. */
async function pollOnce() {
  try {
    if (state.me === null) {
      state.me = await api('/reef/key');
      $('key-form').hidden = true;
      $('who').textContent = state.me.id === 'open' ? 'no API key needed (loopback)' : `key ${state.me.id}${state.me.scenarios ? ` · scenarios ${state.me.scenarios.join(', ')}` : ''}`;
    }
    // One request after another: a key has a few /reef slots (reef.limits.reef_concurrency), and a
    // page that took them all would make the agent's own reports wait.
    fillScenarios((await api('/reef/scenarios')).data);
    renderStatus(await api('/reef/status'));
    if (state.scenario !== null) {
      const s = enc(state.scenario);
      const releases = (await api(`/reef/scenarios/${s}/releases`)).data;
      const curves = await api(`/reef/scenarios/${s}/curves`);
      const turns = (await api(`/reef/scenarios/${s}/judged?limit=20`)).data;
      const chronological = [...releases].reverse();
      drawChart($('reward-chart'), 'reward', curves.reward, [-1, 1], chronological);
      drawChart($('habit-chart'), 'habit', curves.habit, [0, 1], chronological);
      $('reward-caption').textContent = `(mean of the last ${curves.window}; ${curves.reward.length} trained turns)`;
      $('habit-caption').textContent = `(share of the last ${curves.window} replies with ${curves.habitRule.join(', ')})`;
      renderTurns(turns);
      renderReleases(releases);
    }
    showError(null);
    $('updated').textContent = `updated ${new Date().toLocaleTimeString()}`;
    state.polls++;
    document.body.dataset.polls = String(state.polls);
    return POLL_MS;
  } catch (err) {
    if (err instanceof HttpError && err.status === 401) {
      askForKey(storedKey() ? 'the gateway refused this key' : null);
      return null;
    }
    showError(`could not reach the gateway: ${err.message}`);
    return err instanceof HttpError && err.retryAfter ? err.retryAfter * 1000 : POLL_MS;
  }
}

// One round at a time: a round asked for while one runs (a new scenario, a rollback) follows it.
let polling = false;
let pollAgain = false;

async function poll() {
  if (polling) {
    pollAgain = true;
    return;
  }
  polling = true;
  let next;
  try {
    next = await pollOnce();
  } finally {
    polling = false;
  }
  if (pollAgain) {
    pollAgain = false;
    next = 0;
  }
  if (next !== null) schedule(next);
}

function schedule(ms) {
  clearTimeout(state.timer);
  state.timer = setTimeout(poll, ms);
}

document.addEventListener('DOMContentLoaded', () => {
  $('key-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const key = $('key').value.trim();
    if (!key) return;
    try {
      sessionStorage.setItem(KEY_SLOT, key);
    } catch {
      // Storage refused (a private mode): the key cannot be kept, so the page cannot poll with it.
      $('key-error').textContent = 'this browser refuses sessionStorage here, so the key cannot be kept';
      return;
    }
    $('key').value = '';
    schedule(0);
  });
  $('scenario').addEventListener('change', (event) => {
    state.scenario = event.target.value;
    history.replaceState(null, '', `#${encodeURIComponent(state.scenario)}`);
    schedule(0);
  });
  schedule(0);
});
