// tollgate's dashboard: draws GET /stats every second. Rates are the
// difference of two documents over their unix_ms, RATE_SPAN_MS apart
// (a moving average: a fixed window's refusals come in bursts that a
// one-second difference would alias); the chart keeps the last HISTORY
// points in this tab only.
'use strict';

const REFRESH_MS = 1000;
const HISTORY = 120;
const RATE_SPAN_MS = 5000;
const TOKEN_KEY = 'tollgate.admin.token';
const COLORS = ['#58a6ff', '#3fb950', '#d2a8ff', '#f0883e', '#39c5cf', '#ff7b72', '#e3b341', '#a5d6ff'];
const $ = (id) => document.getElementById(id);
// The SVG namespace, read from an inline <svg> rather than spelled out.
const SVG_NS = $('svg-ns').namespaceURI;

let previous = null; // the last document
let base = null; // the document rates are computed from
const recent = []; // the documents of the last RATE_SPAN_MS and a bit
let waitingForToken = false;
const points = []; // { t, rates, refusals: Map(route -> req/s, 429/s) }
const routeColors = new Map();

class Unauthorized extends Error {}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: 'Bearer ' + token } : {};
}

async function adminFetch(path) {
  const response = await fetch(path, { headers: authHeaders(), cache: 'no-store' });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    askForToken();
    throw new Unauthorized('the admin token is needed');
  }
  return response;
}

function askForToken() {
  waitingForToken = true;
  $('token-form').hidden = false;
  $('token').focus();
  setLive('bad', 'waiting for the admin token');
}

$('token-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const token = $('token').value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('token').value = '';
  $('token-form').hidden = true;
  waitingForToken = false;
  refresh();
});

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function fmt(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–';
  if (n >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + 'M';
  if (n >= 1e4) return (n / 1e3).toFixed(n >= 1e5 ? 0 : 1) + 'k';
  if (Number.isInteger(n)) return n.toLocaleString('en-US');
  return n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2).replace(/\.?0+$/, '') || '0';
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return '–';
  if (s < 0.001) return (s * 1e6).toFixed(0) + ' µs';
  if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 1 : 0) + ' ms';
  return s.toFixed(2) + ' s';
}

function setLive(kind, text) {
  $('live-dot').className = 'dot ' + kind;
  $('live').textContent = text;
}

function colorOf(route) {
  if (!routeColors.has(route)) routeColors.set(route, COLORS[routeColors.size % COLORS.length]);
  return routeColors.get(route);
}

// Per second between the previous document and this one.
function rate(now, before, seconds) {
  if (before === undefined || seconds <= 0) return null;
  return Math.max(0, now - before) / seconds;
}

function byName(list, field) {
  return new Map((list || []).map((item) => [item[field], item]));
}

function statusClass(status) {
  if (status === '429') return '429';
  return status[0] + 'xx';
}

function classTotals(statuses) {
  const sums = { '2xx': 0, '429': 0, '4xx': 0, '5xx': 0 };
  for (const [status, n] of Object.entries(statuses || {})) {
    const c = statusClass(status);
    if (c in sums) sums[c] += n;
  }
  return sums;
}

// The smallest bucket bound with at least q of the observations.
function quantile(buckets, count, q) {
  if (!count) return null;
  for (const b of buckets) if (b.count >= q * count) return b.le;
  return buckets.length ? buckets[buckets.length - 1].le : null;
}

// The histogram of the last interval where it has observations, else since start.
function recentLatency(now, before) {
  if (before && now.count > before.count) {
    const old = new Map(before.buckets.map((b) => [b.le, b.count]));
    const buckets = now.buckets.map((b) => ({ le: b.le, count: b.count - (old.get(b.le) || 0) }));
    return { buckets, count: now.count - before.count };
  }
  return { buckets: now.buckets, count: now.count };
}

function render(doc) {
  recent.push(doc);
  while (recent.length > 2 && doc.unix_ms - recent[1].unix_ms >= RATE_SPAN_MS) recent.shift();
  base = recent.length > 1 ? recent[0] : null;
  const seconds = base ? (doc.unix_ms - base.unix_ms) / 1000 : 0;
  renderHeader(doc);
  renderRoutes(doc, seconds);
  renderLimits(doc, seconds);
  renderRefused(doc, seconds);
  renderUpstreams(doc);
  renderStore(doc.store);
  renderExplainChoices(doc.limits);
  renderGeneric('adaptive', doc.adaptive);
  renderGeneric('queues', doc.queues);
  previous = doc;
}

function renderHeader(doc) {
  const config = doc.config || {};
  $('generation').textContent = 'generation ' + config.generation;
  $('sha256').textContent = (config.sha256 || '').slice(0, 12);
  $('sha256').title = 'sha256 ' + (config.sha256 || '');
  $('loaded-at').textContent = config.loaded_at || '–';
  const error = config.last_error;
  $('reload-error').hidden = !error;
  $('reload-error').textContent = error ? 'Last reload failed at ' + error.at + ': ' + error.message + ' (still serving generation ' + config.generation + ')' : '';
  const store = doc.store || {};
  const state = $('store-state');
  state.textContent = store.backend + (store.backend === 'redis' ? ' ' + store.state : '') + (store.fallback_active ? ' · fallback ' + store.on_failure : '');
  state.className = 'pill ' + (store.state === 'up' && !store.fallback_active ? 'ok' : store.state === 'down' ? 'bad' : 'warn');
}

function renderRoutes(doc, seconds) {
  const before = byName(base && base.routes, 'route');
  const rates = new Map();
  const refusals = new Map();
  const tbody = $('routes-table').tBodies[0];
  tbody.replaceChildren();
  for (const route of doc.routes) {
    const old = before.get(route.route);
    const r = old ? rate(route.total, old.total, seconds) : null;
    if (r !== null) rates.set(route.route, r);
    const refused = old ? rate((route.statuses || {})['429'] || 0, (old.statuses || {})['429'] || 0, seconds) : null;
    if (refused !== null) refusals.set(route.route, refused);
    if (route.total === 0 && !r) continue;
    const now = classTotals(route.statuses);
    const then = old ? classTotals(old.statuses) : {};
    const row = el('tr');
    const name = el('td');
    const swatch = el('span', null, 'swatch');
    swatch.style.background = colorOf(route.route);
    name.append(swatch, route.route);
    row.append(name, el('td', fmt(r)));
    for (const c of ['2xx', '429', '4xx', '5xx']) {
      const cr = old ? rate(now[c], then[c], seconds) : null;
      const cell = el('td', cr === null ? '–' : fmt(cr));
      if (c === '429' && cr > 0) cell.className = 'bad-text';
      if (c === '5xx' && cr > 0) cell.className = 'bad-text';
      row.append(cell);
    }
    row.append(el('td', fmt(route.total), 'dim'));
    tbody.append(row);
  }
  if (seconds > 0) {
    points.push({ t: doc.unix_ms, rates, refusals });
    while (points.length > HISTORY) points.shift();
  }
  drawRateChart();
}

function niceMax(value) {
  if (value <= 0) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

function drawRateChart() {
  const chart = $('rate-chart');
  chart.replaceChildren();
  // Drawn at the element's own size, so text is never stretched.
  const W = Math.max(300, Math.floor(chart.getBoundingClientRect().width));
  const [H, left, bottom, top] = [260, 46, 20, 8];
  chart.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
  const routes = new Set();
  let max = 0;
  for (const p of points) for (const [route, r] of p.rates) { routes.add(route); max = Math.max(max, r); }
  const yMax = niceMax(max);
  const x = (i) => left + (W - left - 6) * (HISTORY === 1 ? 1 : i / (HISTORY - 1));
  const y = (v) => top + (H - top - bottom) * (1 - v / yMax);
  for (let k = 0; k <= 4; k++) {
    const v = (yMax * k) / 4;
    chart.append(svg('line', { x1: left, x2: W - 6, y1: y(v), y2: y(v), class: 'grid' }));
    chart.append(svg('text', { x: left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, fmt(v)));
  }
  const span = Math.round((HISTORY * REFRESH_MS) / 1000);
  chart.append(svg('text', { x: left, y: H - 4, class: 'axis' }, '−' + span + ' s'));
  chart.append(svg('text', { x: W - 6, y: H - 4, 'text-anchor': 'end', class: 'axis' }, 'now'));
  if (!points.length) {
    chart.append(svg('text', { x: (W + left) / 2, y: H / 2, 'text-anchor': 'middle', class: 'axis' }, 'collecting… (rates need two samples)'));
    return;
  }
  const offset = HISTORY - points.length;
  // Solid: the route's requests; dashed: those answered 429.
  for (const [field, dashed, what] of [['rates', false, 'req/s'], ['refusals', true, '429/s']]) {
    for (const route of routes) {
      const coords = [];
      points.forEach((p, i) => {
        const r = p[field].get(route);
        if (r !== undefined) coords.push(x(offset + i).toFixed(1) + ',' + y(r).toFixed(1));
      });
      if (dashed && !points.some((p) => p[field].get(route) > 0)) continue;
      const attrs = { points: coords.join(' '), class: 'series', stroke: colorOf(route) };
      if (dashed) attrs['stroke-dasharray'] = '5 4';
      const line = svg('polyline', attrs);
      line.append(svg('title', {}, route + ' ' + what));
      chart.append(line);
    }
  }
}

function renderLimits(doc, seconds) {
  const chart = $('limit-bars');
  chart.replaceChildren();
  const limits = (doc.limits || []).filter((l) => l.allowed + l.denied + l.shadow_denied > 0);
  $('limits-empty').hidden = limits.length > 0;
  const before = byName(base && base.limits, 'limit');
  const rowHeight = 46;
  // Drawn at the element's own size: no scaling, text at its CSS size.
  const W = Math.max(200, Math.floor(chart.getBoundingClientRect().width));
  const H = Math.max(rowHeight * limits.length, 1);
  chart.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
  chart.setAttribute('height', H);
  const max = Math.max(1, ...limits.map((l) => l.allowed + l.denied + l.shadow_denied));
  limits.forEach((limit, i) => {
    const y0 = i * rowHeight;
    const total = limit.allowed + limit.denied + limit.shadow_denied;
    const old = before.get(limit.limit);
    const deniedNow = old ? rate(limit.denied, old.denied, seconds) : null;
    const share = total ? (100 * limit.denied) / total : 0;
    chart.append(svg('text', { x: 0, y: y0 + 14, class: 'name' }, limit.limit));
    const note = fmt(limit.allowed) + ' allowed · ' + fmt(limit.denied) + ' refused (' + share.toFixed(share < 10 ? 1 : 0) + ' %)' +
      (deniedNow === null ? '' : ' · ' + fmt(deniedNow) + ' refused/s');
    chart.append(svg('text', { x: W, y: y0 + 14, 'text-anchor': 'end', class: 'note' }, note));
    chart.append(svg('rect', { x: 0, y: y0 + 20, width: W, height: 14, rx: 3, class: 'track' }));
    let at = 0;
    for (const [field, cls] of [['allowed', 'allowed'], ['denied', 'denied'], ['shadow_denied', 'shadow']]) {
      const width = (W * limit[field]) / max;
      if (width > 0) {
        const bar = svg('rect', { x: at, y: y0 + 20, width: width.toFixed(1), height: 14, class: cls });
        bar.append(svg('title', {}, limit.limit + ': ' + limit[field] + ' ' + field.replace('_', ' ')));
        chart.append(bar);
      }
      at += width;
    }
  });
}

function keyId(k) {
  return k.limit + '\u0000' + k.digest;
}

function renderRefused(doc, seconds) {
  const keys = (doc.refused_keys && doc.refused_keys.keys) || [];
  const before = new Map(((base && base.refused_keys && base.refused_keys.keys) || []).map((k) => [keyId(k), k]));
  const tbody = $('refused-table').tBodies[0];
  tbody.replaceChildren();
  $('refused-empty').hidden = keys.length > 0;
  keys.slice(0, 10).forEach((k, i) => {
    const old = before.get(keyId(k));
    const row = el('tr');
    row.append(el('td', i + 1, 'dim'), el('td', k.limit));
    const who = el('td');
    if (k.consumer) who.append(el('span', k.consumer), el('span', ' consumer', 'dim'));
    else if (k.tenant) who.append(el('span', k.tenant), el('span', ' tenant', 'dim'));
    else {
      // A digest: say what it is a digest of (the limit's key).
      const limit = (doc.limits || []).find((l) => l.limit === k.limit);
      who.append(el('span', k.digest.slice(0, 12) + '…', 'digest'));
      if (limit && limit.key) who.append(el('span', ' ' + limit.key, 'dim'));
    }
    who.title = 'digest ' + k.digest;
    const count = el('td', fmt(k.count) + (k.error ? ' ±' + fmt(k.error) : ''), 'num');
    const now = old ? rate(k.count, old.count, seconds) : null;
    row.append(who, count, el('td', now === null ? '–' : fmt(now), 'num'));
    tbody.append(row);
  });
}

function renderUpstreams(doc) {
  const tbody = $('upstreams-table').tBodies[0];
  tbody.replaceChildren();
  const upstreams = doc.upstreams || [];
  $('upstreams-empty').hidden = upstreams.length > 0;
  const before = byName(base && base.upstreams, 'upstream');
  for (const upstream of upstreams) {
    const old = before.get(upstream.upstream);
    const latency = recentLatency(upstream.latency, old && old.latency);
    const head = el('tr', null, 'upstream');
    const name = el('td');
    const healthy = upstream.urls.filter((u) => u.healthy).length;
    const dot = el('span', null, 'dot ' + (healthy === upstream.urls.length ? 'ok' : healthy ? 'warn' : 'bad'));
    name.append(dot, ' ' + upstream.upstream, el('span', '  ' + healthy + '/' + upstream.urls.length + ' up' +
      (upstream.routes.length ? ' · routes ' + upstream.routes.join(', ') : ''), 'dim'));
    const errors = Object.values(upstream.errors || {}).reduce((a, b) => a + b, 0);
    head.append(name, el('td', fmt(upstream.urls.reduce((a, u) => a + u.ejections_total, 0)), 'num'),
      el('td', fmt(errors), 'num' + (errors ? ' bad-text' : '')),
      el('td', latency.count ? '≤ ' + fmtSeconds(quantile(latency.buckets, latency.count, 0.5)) : '–', 'num'),
      el('td', latency.count ? '≤ ' + fmtSeconds(quantile(latency.buckets, latency.count, 0.99)) : '–', 'num'));
    tbody.append(head);
    for (const url of upstream.urls) {
      const row = el('tr', null, 'url');
      const cell = el('td');
      cell.append(el('span', null, 'dot ' + (url.healthy ? 'ok' : 'bad')), el('span', ' ' + url.url, 'mono'));
      cell.title = Object.entries(url.ejections).map(([r, n]) => r + ': ' + n).join(', ') || 'never ejected';
      row.append(cell, el('td', fmt(url.ejections_total), 'num'), el('td', ''), el('td', ''), el('td', ''));
      tbody.append(row);
    }
  }
}

function renderStore(store) {
  const facts = $('store-facts');
  facts.replaceChildren();
  const add = (name, value, cls) => facts.append(el('dt', name), el('dd', value, cls));
  add('backend', store.backend);
  add('state', store.state, store.state === 'up' ? 'ok-text' : 'bad-text');
  if (store.on_failure) add('on failure', store.on_failure);
  add('fallback', store.fallback_active ? 'active' : 'no', store.fallback_active ? 'bad-text' : '');
  add('errors', fmt(store.errors), store.errors ? 'bad-text' : '');
  if (store.backend === 'redis') add('remembered denials', fmt(store.remembered_denials));
}

function renderExplainChoices(limits) {
  const select = $('explain-limit');
  const names = (limits || []).map((l) => l.limit);
  const have = Array.from(select.options).map((o) => o.value);
  if (names.join('\u0000') !== have.join('\u0000')) {
    const chosen = select.value;
    select.replaceChildren(...names.map((n) => el('option', n)));
    if (names.includes(chosen)) select.value = chosen;
  }
  const limit = (limits || []).find((l) => l.limit === select.value);
  $('explain-hint').textContent = limit && limit.key ? 'keyed by ' + limit.key + (limit.policy ? ' · ' + limit.policy : '') : '';
}

$('explain-limit').addEventListener('change', () => previous && renderExplainChoices(previous.limits));

$('explain-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const limit = $('explain-limit').value;
  const key = $('explain-key').value;
  const out = $('explain-result');
  out.replaceChildren(el('p', 'asking…', 'hint'));
  if (!limit) return out.replaceChildren(el('p', 'No limit to ask about.', 'hint'));
  const query = key.split(',').map((part) => 'key=' + encodeURIComponent(part.trim())).join('&');
  try {
    const response = await adminFetch('/limits/' + encodeURIComponent(limit) + '?' + query);
    const body = await response.json();
    if (!response.ok) return out.replaceChildren(el('p', body.detail || body.title || 'HTTP ' + response.status, 'bad-text'));
    const refusedNow = body.remaining === 0;
    const verdict = el('p', refusedNow ? 'Refused now: no quota left; more in ' + body.reset_seconds + ' s.'
      : 'Not refused now: ' + body.remaining + ' of ' + body.quota + ' left.', 'verdict ' + (refusedNow ? 'bad-text' : 'ok-text'));
    const list = el('dl');
    const add = (name, value) => list.append(el('dt', name), el('dd', value));
    add('policy', body.policy);
    add('remaining', body.remaining + ' of ' + body.quota);
    add('window', body.window_seconds === null || body.window_seconds === undefined ? '–' : body.window_seconds + ' s');
    add('reset in', body.reset_seconds + ' s');
    add('source', body.source);
    if (body.plan) add('plan', body.plan);
    if (body.shadow) add('shadow', 'yes: it never refuses');
    add('digest', body.digest);
    const top = previous && previous.refused_keys && previous.refused_keys.keys.findIndex((k) => k.limit === limit && k.digest === body.digest);
    if (top >= 0) add('refused', fmt(previous.refused_keys.keys[top].count) + ' times (#' + (top + 1) + ' of the keys refused most)');
    out.replaceChildren(verdict, list);
  } catch (error) {
    if (!(error instanceof Unauthorized)) out.replaceChildren(el('p', String(error.message || error), 'bad-text'));
  }
});

// adaptive and queues: one row per object, one column per field, the
// limit's name first (it says what the row is) and the field names read
// as words.
function renderGeneric(id, rows) {
  const section = $(id);
  section.hidden = !rows || rows.length === 0;
  if (section.hidden) return;
  const table = $(id + '-table');
  const fields = new Set(rows.flatMap((r) => Object.keys(r)));
  const columns = fields.has('limit') ? ['limit', ...[...fields].filter((c) => c !== 'limit')] : [...fields];
  const head = el('tr');
  for (const c of columns) head.append(el('th', c.replaceAll('_', ' ')));
  table.tHead.replaceChildren(head);
  table.tBodies[0].replaceChildren(...rows.map((r) => {
    const row = el('tr');
    for (const c of columns) row.append(el('td', typeof r[c] === 'object' && r[c] !== null ? JSON.stringify(r[c]) : r[c]));
    return row;
  }));
}

async function refresh() {
  if (waitingForToken) return;
  try {
    const response = await adminFetch('/stats');
    if (!response.ok) throw new Error('/stats answered ' + response.status);
    render(await response.json());
    setLive('ok', 'live · ' + new Date().toLocaleTimeString());
  } catch (error) {
    if (!(error instanceof Unauthorized)) setLive('bad', 'cannot read /stats: ' + (error.message || error));
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
