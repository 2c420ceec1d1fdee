// Ferry console: a small front end on the admin API (api/v1/). Every value
// from the API reaches the page as text (textContent, attribute values set
// through the DOM), never as markup, so a key, payload, header or error
// text cannot inject anything.
'use strict';

const API = 'api/v1/';
const TOKEN_KEY = 'ferry-console-token';
const POLL_MS = 3000;
const SAMPLES = 60; // points kept per sparkline (3 minutes at POLL_MS)

// ---- DOM helpers ----

// el builds an element: attrs are properties/attributes (on* are
// listeners), children are nodes or strings (made text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  append(e, children);
  return e;
}

function append(parent, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    parent.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return parent;
}

function link(href, ...children) { return el('a', { href }, ...children); }

// fmtTime writes a time in the browser's time zone, to the millisecond,
// with the zone's offset (UTC when none): 2026-12-06 09:31:17.042 +01:00.
function fmtTime(t) {
  if (!t) return '';
  const d = new Date(t);
  if (isNaN(d)) return String(t);
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  const off = -d.getTimezoneOffset();
  const zone = off === 0 ? 'UTC' : `${off > 0 ? '+' : '-'}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)} ${zone}`;
}

function fmtSeconds(s) {
  if (s === undefined || s === null) return '';
  if (s < 1) return (s * 1000).toFixed(0) + ' ms';
  if (s < 120) return s.toFixed(1) + ' s';
  if (s < 7200) return (s / 60).toFixed(1) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

function fmtCount(n, capped) {
  const s = Number(n || 0).toLocaleString();
  return capped && n >= capped ? s + '+' : s;
}

function stateBadge(state) { return el('span', { class: 'state ' + state }, state); }

function keyLink(key) { return link('#/keys/' + encodeURIComponent(key), el('span', { class: 'mono' }, key)); }

// eventLink shows an event's whole ID: UUIDv7s of one minute share their
// first digits, so a cut one names many events.
function eventLink(id) { return link('#/events/' + encodeURIComponent(id), el('span', { class: 'mono id' }, id)); }

// UUID matches an event ID (any UUID version).
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

// search opens what the search box names: an event by its ID, else a key.
function search(e) {
  e.preventDefault();
  const input = document.getElementById('search-input');
  const q = input.value.trim();
  if (!q) return;
  input.value = '';
  location.hash = (UUID.test(q) ? '#/events/' : '#/keys/') + encodeURIComponent(q);
}

// ---- the API ----

function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

// get reads the API, with the token (reads need it unless the console
// was started with --open-reads).
async function get(path) {
  const headers = { Accept: 'application/json' };
  if (token()) headers.Authorization = 'Bearer ' + token();
  const r = await fetch(API + path, { headers });
  const body = await r.json().catch(() => ({ error: r.status + ' ' + r.statusText }));
  if (!r.ok) throw Object.assign(new Error(body.error || r.statusText), { status: r.status });
  return body;
}

// post runs an action; the API wants the token, a JSON body and this origin.
async function post(path, body) {
  const headers = { 'Content-Type': 'application/json', Accept: 'application/json' };
  if (token()) headers.Authorization = 'Bearer ' + token();
  const r = await fetch(API + path, { method: 'POST', headers, body: JSON.stringify(body) });
  const out = await r.json().catch(() => ({ error: r.status + ' ' + r.statusText }));
  if (!r.ok) throw new Error(out.error || r.statusText);
  return out;
}

function flash(msg, isError) {
  const f = document.getElementById('flash');
  f.textContent = msg;
  f.className = isError ? 'error' : '';
  f.hidden = false;
  clearTimeout(flash.timer);
  if (!isError) flash.timer = setTimeout(() => { f.hidden = true; }, 6000);
}

// confirmAction asks the API how many events an action selects (a dry
// run), shows the count in place, and acts on exactly that many once
// confirmed (expect: a selection that changed meanwhile is refused).
async function confirmAction(where, path, body, what) {
  let dry;
  try {
    dry = await post(path, { ...body, dry_run: true });
  } catch (e) {
    flash(e.message, true);
    return;
  }
  where.querySelectorAll('.confirm').forEach((c) => c.remove());
  const box = el('div', { class: 'confirm', role: 'alertdialog' },
    el('span', {}, `${what}: ${dry.selected} event${dry.selected === 1 ? '' : 's'}?`),
    el('button', {
      class: 'primary', 'data-confirm': 'yes', onclick: async () => {
        box.remove();
        try {
          const res = await post(path, { ...body, expect: dry.selected });
          flash(`${what}: done for ${res.done} event${res.done === 1 ? '' : 's'}.`);
        } catch (e) {
          flash(e.message, true);
        }
        route();
      },
    }, 'Confirm'),
    el('button', { onclick: () => box.remove() }, 'Cancel'));
  where.prepend(box);
}

// ---- sparklines from successive polls ----

const samples = new Map(); // series name → [numbers] (not `history`: that is window.history)

function sample(name, v) {
  const s = samples.get(name) || [];
  s.push(Number(v) || 0);
  if (s.length > SAMPLES) s.shift();
  samples.set(name, s);
  return s;
}

// sparkline draws values (the last of width points; the chart's left is
// empty until there are width) as a line; title describes it.
function sparkline(values, label, width = SAMPLES, title = `${label}: last ${values.length} samples, ${POLL_MS / 1000} s apart`) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', `0 0 ${width - 1} 40`);
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', label);
  const max = Math.max(1, ...values);
  const off = width - values.length;
  const pts = values.map((v, i) => `${off + i},${(38 - (v / max) * 36).toFixed(1)}`).join(' ');
  const line = document.createElementNS(ns, 'polyline');
  line.setAttribute('points', values.length === 1 ? `${off},${pts.split(',')[1]} ${width - 1},${pts.split(',')[1]}` : pts);
  svg.appendChild(line);
  const t = document.createElementNS(ns, 'title');
  t.textContent = `${title}, max ${Math.max(0, ...values).toLocaleString(undefined, { maximumFractionDigits: 1 })}`;
  svg.appendChild(t);
  return svg;
}

// ---- series the relays and consumers record (api/v1/activity) ----

const ACTIVITY_WINDOW = '15m';

// activitySeries indexes activity's series by kind and name.
function activitySeries(activity) {
  const m = new Map();
  for (const s of (activity && activity.series) || []) m.set(s.kind + ':' + s.name, s);
  return m;
}

// seriesSpark draws one figure of a series' points (field: events done
// per second, a relay's lag) over the window, a step with no sample drawn
// as 0.
function seriesSpark(act, s, field, label) {
  const steps = Math.max(2, Math.round((new Date(act.until) - new Date(act.since)) / 1000 / act.step_seconds));
  const values = new Array(steps).fill(0);
  for (const p of (s && s.points) || []) {
    const i = Math.round((new Date(p.at) - new Date(act.since)) / 1000 / act.step_seconds) - 1;
    if (i >= 0 && i < steps) values[i] = p[field] || 0;
  }
  return sparkline(values, label, steps, `${label}: the last ${ACTIVITY_WINDOW}, in steps of ${act.step_seconds} s`);
}

function rateSpark(act, s, label) { return seriesSpark(act, s, 'done_per_second', label); }

// activityFigures are a series' last step: events/s, and its latencies.
function activityFigures(s, done, latency) {
  const last = s && s.points.length ? s.points[s.points.length - 1] : null;
  const fresh = last && (Date.now() - new Date(last.at)) < 60000;
  const rate = (v) => (fresh ? v : 0).toLocaleString(undefined, { maximumFractionDigits: 1 });
  const figs = [figure(rate(last ? last.done_per_second : 0), done + '/s')];
  if (last && fresh && last.done > 0) figs.push(figure(fmtSeconds(last.latency_p99_seconds), latency + ' p99'));
  if (last && fresh && last.handler_p99_seconds) figs.push(figure(fmtSeconds(last.handler_p99_seconds), 'handler p99'));
  if (last && fresh && last.failed > 0) figs.push(figure(rate(last.failed_per_second), 'failed/s'));
  return figs;
}

// ---- pages ----

function figure(value, label) { return el('div', { class: 'figure' }, el('b', {}, value), el('span', {}, label)); }

async function overview(main) {
  const [feeds, groups, chains, activity] = await Promise.all([get('feeds'), get('groups').catch((e) => ({ error: e.message })),
    get('chains').catch(() => ({ chains: [] })), get('activity?since=' + ACTIVITY_WINDOW).catch(() => null)]);
  const series = activitySeries(activity);
  const page = [el('h1', {}, 'Overview')];
  page.push(el('h2', {}, 'Relay feeds'));
  const otx = feeds.oldest_outbox_tx;
  if (otx && otx.age_seconds >= 1) {
    page.push(el('p', { class: 'watched-tx', id: 'oldest-outbox-tx' },
      `An open transaction wrote to the outbox ${fmtSeconds(otx.age_seconds)} ago and has not committed: pid ${otx.pid}`,
      otx.state ? ` (${otx.state})` : '', otx.application ? `, application ${otx.application}` : '',
      el('span', { class: 'muted' }, '. Its events are published when it commits.')));
  }
  const recorded = activity && activity.recorded;
  page.push(el('div', { class: 'cards', id: 'feeds' }, feeds.feeds.map((f) => {
    // The lag over time: the relays record it in their samples; without
    // them, what this page saw since it opened.
    const lag = recorded ? null : sample('lag:' + f.feed, f.lag_events);
    return el('div', { class: 'card', dataset: { feed: f.feed } },
      el('h3', {}, f.feed, ' ', f.lease_held ? el('span', { class: 'state processed' }, 'led') : el('span', { class: 'state failed' }, 'no leader')),
      el('div', { class: 'figures' },
        figure(fmtCount(f.lag_events) + (f.lag_estimated ? ' ≈' : ''), 'events behind'),
        figure(fmtSeconds(f.lag_seconds) || '0 s', 'oldest unpublished'),
        figure(f.checkpoint_at ? fmtSeconds(f.checkpoint_age_seconds) : 'never', 'since checkpoint'),
        figure(link('#/dead-letters?feed=' + encodeURIComponent(f.feed), fmtCount(f.dead_letters) + (f.dead_letters_more ? '+' : '')), 'dead letters')),
      recorded ? seriesSpark(activity, series.get('relay:' + f.feed), 'lag_events', 'events behind') : sparkline(lag, 'events behind'),
      el('div', { class: 'muted caption' }, recorded ? `events behind, the last ${ACTIVITY_WINDOW} (the largest of each step)` : 'events behind, since this page opened'),
      recorded ? [
        el('div', { class: 'figures activity' }, activityFigures(series.get('relay:' + f.feed), 'published', 'commit → publish')),
        rateSpark(activity, series.get('relay:' + f.feed), 'events published per second'),
        el('div', { class: 'muted caption' }, `published per second, the last ${ACTIVITY_WINDOW}`),
      ] : null,
      el('div', { class: 'muted' }, f.lease_holder ? `leader ${f.lease_holder}, term ${f.lease_term}` : 'no lease yet', ' · ', link('#/parked', 'parked keys')));
  })));
  page.push(el('h2', {}, 'Consumer groups'));
  if (groups.error) {
    page.push(el('p', { class: 'muted' }, groups.error));
  } else if (groups.groups.length === 0) {
    page.push(el('p', { class: 'muted' }, 'No consumer group has received an event yet.'));
  } else {
    page.push(el('div', { class: 'cards', id: 'groups' }, groups.groups.map((g) => {
      const c = g.counts || {};
      const backlog = sample('backlog:' + g.group, (c.pending || 0) + (c.failed || 0) + (c.processing || 0));
      return el('div', { class: 'card', dataset: { group: g.group } },
        el('h3', {}, link('#/groups/' + encodeURIComponent(g.group), g.group)),
        el('div', { class: 'figures' },
          figure(fmtCount(c.pending, groups.count_cap), 'pending'),
          figure(fmtCount(c.processing, groups.count_cap), 'processing'),
          figure(fmtCount(c.failed, groups.count_cap), 'retrying'),
          figure(link('#/groups/' + encodeURIComponent(g.group) + '?state=dead', fmtCount(c.dead, groups.count_cap)), 'dead')),
        el('div', { class: 'muted caption policy' }, g.dead_policy === 'hold'
          ? `dead policy hold: ${c.dead ? fmtCount(c.dead, groups.count_cap) + ' dead event(s) hold their keys' : 'no key held'}`
          : 'dead policy continue: no key is held'),
        sparkline(backlog, 'backlog (pending, processing, retrying)'),
        el('div', { class: 'muted caption' }, 'backlog, since this page opened'),
        activity && activity.recorded ? [
          el('div', { class: 'figures activity' }, activityFigures(series.get('consumer:' + g.group), 'applied', 'commit → applied')),
          rateSpark(activity, series.get('consumer:' + g.group), 'events applied per second'),
          el('div', { class: 'muted caption' }, `applied per second, the last ${ACTIVITY_WINDOW}`),
        ] : null);
    })));
  }
  if (chains.chains.length) {
    page.push(el('h2', {}, 'Chain sources'));
    page.push(el('div', { class: 'cards', id: 'chains' }, chains.chains.map((c) => {
      const lag = c.head_lag_blocks !== undefined ? sample('chain:' + c.name, c.head_lag_blocks) : null;
      return el('div', { class: 'card', dataset: { chain: c.name } },
        el('h3', {}, c.name, ' ', c.lease_held ? el('span', { class: 'state processed' }, 'led') : el('span', { class: 'state failed' }, 'no leader')),
        el('div', { class: 'figures' },
          figure(Number(c.block).toLocaleString(), 'last block ingested'),
          figure(c.head_lag_blocks !== undefined ? Number(c.head_lag_blocks).toLocaleString() : '?', 'blocks behind the head'),
          figure(c.tier || '?', 'tier'),
          figure(Number(c.reorgs).toLocaleString(), 'reorgs')),
        lag ? sparkline(lag, 'blocks behind the head') : null,
        el('div', { class: 'muted' }, `chain ${c.chain_id}, saved ${fmtTime(c.saved_at)}`, c.lease_holder ? `, leader ${c.lease_holder}` : '', c.head_error ? ` · ${c.head_error}` : ''));
    })));
  }
  main.replaceChildren(...page);
  return true; // poll
}

// groupByReason groups items by feed(item) and reason(item), largest
// group first: [{feed, reason, rows}].
function groupByReason(items, reason, feed) {
  const m = new Map();
  for (const it of items) {
    const g = { feed: feed(it) || '', reason: reason(it) || '(no error text)' };
    const k = g.feed + '\u0000' + g.reason;
    if (!m.has(k)) m.set(k, { ...g, rows: [] });
    m.get(k).rows.push(it);
  }
  return [...m.values()].sort((a, b) => b.rows.length - a.rows.length);
}

// byReason groups a page's items by reason (relay dead letters: by feed
// partition and reason), in the server's grouping of the newest failures
// when it has one (reasons: the API's answer, or null): each group's
// count and the IDs its actions take are the server's, its rows those of
// the page; reasons only the page has follow, counted on the page.
function byReason(items, reasonOf, reasons, feedOf = () => '') {
  const key = (g) => (g.feed || '') + '\u0000' + g.reason;
  const page = groupByReason(items, reasonOf, feedOf);
  const ids = (rows) => rows.map((r) => r.event.id);
  if (!reasons) return page.map((g) => ({ ...g, count: g.rows.length, ids: ids(g.rows) }));
  const rowsOf = new Map(page.map((g) => [key(g), g]));
  const out = reasons.reasons.map((r) => {
    const g = { feed: r.feed || '', reason: r.reason || '(no error text)' };
    const rows = (rowsOf.get(key(g)) || { rows: [] }).rows;
    rowsOf.delete(key(g));
    return { ...g, rows, count: r.count, ids: r.ids, server: true };
  });
  for (const g of rowsOf.values()) out.push({ ...g, count: g.rows.length, ids: ids(g.rows) });
  return out;
}

// letters names relay dead letters for an action: each by its feed.
function letters(feed, ids) { return ids.map((id) => ({ feed, id })); }

// reasons asks the API to group the newest failures by reason (path:
// dead-letters/reasons or groups/{g}/reasons); null when it cannot.
async function reasons(path) {
  try {
    return await get(path);
  } catch (e) {
    return null;
  }
}

function reasonsNote(rs, what) {
  if (!rs) return `${what} on this page, grouped by reason. An action shows its count before it runs.`;
  const read = rs.scanned < rs.scan ? `all ${rs.scanned.toLocaleString()}` : `the newest ${rs.scanned.toLocaleString()}`;
  return `Grouped by reason over ${read}; an action takes up to 500 of a reason at a time and shows its count before it runs.`;
}

function reasonBlock(g, header, row, actions) {
  const block = el('section', { class: 'reason', dataset: { count: g.count } });
  append(block, [
    el('div', { class: 'head' }, el('b', {}, g.count.toLocaleString()), g.feed ? el('span', { class: 'feed mono' }, g.feed) : null,
      el('span', { class: 'text' }, g.reason), el('div', { class: 'actions' }, actions(block, g.ids, g.feed))),
    g.rows.length ? el('table', {}, el('thead', {}, el('tr', {}, header.map((h) => el('th', {}, h)))), el('tbody', {}, g.rows.map(row)))
      : el('p', { class: 'muted' }, 'None of them on this page.'),
  ]);
  return block;
}

async function deadLetters(main, params) {
  const q = new URLSearchParams();
  for (const k of ['feed', 'key', 'type', 'topic', 'after']) if (params.get(k)) q.set(k, params.get(k));
  q.set('limit', '500');
  const rq = new URLSearchParams();
  if (params.get('feed')) rq.set('feed', params.get('feed'));
  const filtered = ['key', 'type', 'topic', 'after'].some((k) => params.get(k));
  const [page, rs] = await Promise.all([get('dead-letters?' + q), filtered ? null : reasons('dead-letters/reasons?' + rq)]);
  const items = page.dead_letters;
  const filter = {};
  for (const k of ['feed', 'key', 'type', 'topic']) if (params.get(k)) filter[k] = params.get(k);
  const out = [el('h1', {}, 'Relay dead letters')];
  if (Object.keys(filter).length) out.push(el('p', { class: 'muted' }, 'Filtered by ', Object.entries(filter).map(([k, v]) => `${k} = ${v}`).join(', '), ' · ', link('#/dead-letters', 'show all')));
  if (items.length === 0) {
    out.push(el('p', { class: 'muted', id: 'empty' }, 'No dead letters.'));
  } else {
    out.push(el('p', { class: 'muted' }, reasonsNote(rs, `${items.length.toLocaleString()}`)));
    for (const g of byReason(items, (d) => d.reason, rs, (d) => d.feed)) {
      out.push(reasonBlock(g, ['Event', 'Feed', 'Topic', 'Key', 'Type', 'Failed at', ''], (d) => el('tr', { dataset: { id: d.event.id } },
        el('td', {}, eventLink(d.event.id)), el('td', {}, d.feed), el('td', {}, d.event.topic),
        el('td', { class: 'clip' }, keyLink(d.event.key)),
        el('td', {}, d.event.type), el('td', {}, fmtTime(d.failed_at)),
        el('td', {}, el('div', { class: 'actions' },
          el('button', { onclick: (e) => confirmAction(e.target.closest('section'), 'dead-letters/redrive', { letters: letters(d.feed, [d.event.id]) }, 'Redrive') }, 'Redrive'),
          el('button', { class: 'danger', onclick: (e) => confirmAction(e.target.closest('section'), 'dead-letters/discard', { letters: letters(d.feed, [d.event.id]) }, 'Discard') }, 'Discard')))),
      (block, ids, feed) => [
        el('button', { class: 'primary', onclick: () => confirmAction(block, 'dead-letters/redrive', { letters: letters(feed, ids) }, 'Redrive') }, `Redrive ${ids.length}`),
        el('button', { class: 'danger', onclick: () => confirmAction(block, 'dead-letters/discard', { letters: letters(feed, ids) }, 'Discard') }, `Discard ${ids.length}`),
      ]));
    }
  }
  if (page.scanned) out.push(scannedNote(page.scanned));
  if (page.next) {
    const n = new URLSearchParams(params);
    n.set('after', page.next);
    out.push(el('p', {}, link('#/dead-letters?' + n, 'Next page →')));
  }
  main.replaceChildren(...out);
  return false;
}

const STATES = ['dead', 'failed', 'pending', 'processing', 'processed', 'retracted', 'discarded'];

async function group(main, name, params) {
  const state = params.get('state') || 'dead';
  const q = new URLSearchParams({ state, limit: '500' });
  for (const k of ['key', 'after']) if (params.get(k)) q.set(k, params.get(k));
  const grouped = state === 'dead' && !params.get('key') && !params.get('after');
  const [page, rs] = await Promise.all([get('groups/' + encodeURIComponent(name) + '/events?' + q),
    grouped ? reasons('groups/' + encodeURIComponent(name) + '/reasons') : null]);
  const base = '#/groups/' + encodeURIComponent(name);
  const out = [el('h1', {}, 'Group ', name)];
  out.push(el('div', { class: 'tabs' }, STATES.map((s) => el('a', { href: base + '?state=' + s, class: s === state ? 'active' : '' }, s))));
  if (state === 'dead') {
    const hold = page.dead_policy === 'hold';
    const policy = el('div', { class: 'actions', id: 'policy', dataset: { policy: page.dead_policy } }, el('span', { class: 'muted' }, 'Dead policy:'),
      el('b', {}, hold ? 'hold (each dead event holds its key’s later events)' : 'continue (a dead event’s key goes on)'),
      el('button', { class: hold ? 'active' : '', disabled: hold, onclick: () => setPolicy(name, true) }, 'Hold a dead event’s key'),
      el('button', { class: hold ? '' : 'active', disabled: !hold, onclick: () => setPolicy(name, false) }, 'Let its later events run'));
    out.push(policy);
  }
  const rows = page.events;
  if (rows.length === 0) {
    out.push(el('p', { class: 'muted', id: 'empty' }, `No ${state} events.`));
  } else if (state === 'dead' || state === 'failed') {
    if (state === 'dead') out.push(el('p', { class: 'muted' }, reasonsNote(rs, `${rows.length.toLocaleString()}`)));
    for (const g of byReason(rows, (r) => r.last_error, rs)) {
      out.push(reasonBlock(g, ['Event', 'Key', 'Type', 'Attempts', 'Received', state === 'dead' ? 'Dead since' : 'Next attempt'], (r) => el('tr', { dataset: { id: r.event.id } },
        el('td', {}, eventLink(r.event.id)), el('td', { class: 'clip' }, keyLink(r.event.key)), el('td', {}, r.event.type),
        el('td', { class: 'num' }, r.attempts), el('td', {}, fmtTime(r.received_at)), el('td', {}, fmtTime(state === 'dead' ? r.finished_at : r.next_attempt_at))),
      (block, ids) => state !== 'dead' ? [] : [
        el('button', { class: 'primary', onclick: () => confirmAction(block, 'groups/' + encodeURIComponent(name) + '/redrive', { ids }, 'Redrive') }, `Redrive ${ids.length}`),
        el('button', { class: 'danger', onclick: () => confirmAction(block, 'groups/' + encodeURIComponent(name) + '/discard', { ids }, 'Discard') }, `Discard ${ids.length}`),
      ]));
    }
  } else {
    out.push(el('table', {}, el('thead', {}, el('tr', {}, ['Event', 'Key', 'Seq', 'Type', 'Attempts', 'Received', 'Finished'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows.map((r) => el('tr', { dataset: { id: r.event.id } },
        el('td', {}, eventLink(r.event.id)), el('td', { class: 'clip' }, keyLink(r.event.key)), el('td', { class: 'num' }, r.event.seq), el('td', {}, r.event.type),
        el('td', { class: 'num' }, r.attempts), el('td', {}, fmtTime(r.received_at)), el('td', {}, fmtTime(r.finished_at)))))));
  }
  if (page.scanned) out.push(scannedNote(page.scanned));
  if (page.next) {
    const n = new URLSearchParams(params);
    n.set('state', state);
    n.set('after', page.next);
    out.push(el('p', {}, link(base + '?' + n, 'Next page →')));
  }
  main.replaceChildren(...out);
  return state === 'processing' || state === 'pending';
}

async function setPolicy(name, hold) {
  try {
    await post('groups/' + encodeURIComponent(name) + '/policy', { hold_dead: hold });
    flash(hold ? `${name}: a dead event now holds its key’s later events.` : `${name}: a dead event’s key now goes on.`);
    await route();
  } catch (e) {
    flash(e.message, true);
  }
}

function fields(pairs) {
  return el('dl', { class: 'fields' }, pairs.filter(([, v]) => v !== undefined && v !== '').map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
}

function payloadView(ev) {
  if (ev.payload_text !== undefined && ev.payload_text !== null) return el('pre', { id: 'payload' }, ev.payload_text);
  const bytes = atob(ev.payload || '');
  const hex = [...bytes.slice(0, 512)].map((c) => c.charCodeAt(0).toString(16).padStart(2, '0')).join(' ');
  return el('div', {}, el('p', { class: 'muted' }, `binary, ${bytes.length.toLocaleString()} bytes${bytes.length > 512 ? ' (the first 512 shown)' : ''}`), el('pre', { id: 'payload' }, hex));
}

// historyView lists a group's failed attempts and redrives of an event,
// oldest first (the API keeps the latest 20 of them).
function historyView(history) {
  return el('ol', { class: 'attempts' }, history.map((h) => h.state === 'pending'
    ? el('li', { class: 'redrive' }, el('b', {}, 'Redriven'), ' ', el('span', { class: 'muted' }, `${fmtTime(h.at)}, after ${h.attempt} attempt${h.attempt === 1 ? '' : 's'}`))
    : el('li', { class: h.state }, el('b', {}, `Attempt ${h.attempt}`), ' ', stateBadge(h.state), ' ', el('span', { class: 'muted' }, fmtTime(h.at)),
      h.error ? el('pre', {}, h.error) : null)));
}

// scannedNote says that a filter no index serves was matched over the
// events read, not over all of them (the next page reads on).
function scannedNote(n) {
  return el('p', { class: 'muted', id: 'scanned' }, `Matched among ${Number(n).toLocaleString()} events read from where this page starts; the next page, if any, reads on.`);
}

async function eventPage(main, id) {
  const t = await get('events/' + encodeURIComponent(id));
  const ev = (t.dead_letters[0] && t.dead_letters[0].event) || (t.groups[0] && t.groups[0].event) || t.outbox.event;
  const out = [el('h1', {}, 'Event ', el('span', { class: 'mono' }, t.id))];
  out.push(fields([['Topic', ev.topic], ['Key', link('#/keys/' + encodeURIComponent(ev.key), el('span', { class: 'mono', id: 'event-key' }, ev.key))], ['Seq', ev.seq ? String(ev.seq) : 'given by the relay as it publishes'], ['Type', ev.type],
    ['Source', ev.source], ['Content type', ev.content_type], ['Committed', fmtTime(ev.created_at)]]));
  const steps = [el('li', { class: 'good' }, el('b', {}, 'Committed to the outbox'), ' ', el('span', { class: 'muted' }, fmtTime(ev.created_at)))];
  // One dead letter per feed partition that dead-lettered it: an action
  // on one reaches that feed's only.
  for (const dl of t.dead_letters) {
    steps.push(el('li', { class: 'bad relay-dead', dataset: { feed: dl.feed } }, el('b', {}, 'Dead-lettered by the relay of feed ', el('span', { class: 'mono' }, dl.feed)), ' ',
      el('span', { class: 'muted' }, fmtTime(dl.failed_at)),
      el('pre', {}, dl.reason),
      el('div', { class: 'actions' },
        el('button', { class: 'primary', onclick: (e) => confirmAction(e.target.closest('li'), 'dead-letters/redrive', { letters: letters(dl.feed, [t.id]) }, `Redrive to ${dl.feed}`) }, 'Redrive'),
        el('button', { class: 'danger', onclick: (e) => confirmAction(e.target.closest('li'), 'dead-letters/discard', { letters: letters(dl.feed, [t.id]) }, `Discard from ${dl.feed}`) }, 'Discard'))));
  }
  if (t.dead_letters.length === 0 && t.outbox) {
    // Not published yet: where it waits in its partition's backlog.
    const o = t.outbox;
    steps.push(o.invalid
      ? el('li', { class: 'bad', id: 'unpublished' }, el('b', {}, 'Not publishable'), ' ', el('span', { class: 'muted' }, `${o.feed}: the relay will dead-letter it`), el('pre', {}, o.invalid))
      : el('li', { id: 'unpublished' }, el('b', {}, 'Waiting in the outbox'), ' ',
        el('span', { class: 'muted' }, `${o.ahead.toLocaleString()} event${o.ahead === 1 ? '' : 's'} ahead of it in ${o.feed}; `, link('#/', 'the feeds’ lag'))));
  } else if (t.dead_letters.length === 0 && t.groups.length) {
    // The relay keeps no time per event (an index on the outbox to find
    // one would cost every append): its first delivery bounds it.
    const first = t.groups.map((g) => g.received_at).sort((a, b) => Date.parse(a) - Date.parse(b))[0];
    steps.push(el('li', { class: 'good', id: 'published' }, el('b', {}, 'Published by the relay'), ' ', el('span', { class: 'muted' }, `by ${fmtTime(first)}, its first delivery`)));
  }
  for (const g of t.groups) {
    const done = g.state === 'processed' ? 'good' : (g.state === 'dead' || g.state === 'failed' ? 'bad' : '');
    steps.push(el('li', { class: done, dataset: { group: g.group } },
      el('b', {}, 'Group ', link('#/groups/' + encodeURIComponent(g.group), g.group)), ' ', stateBadge(g.state), ' ',
      el('span', { class: 'muted' }, `received ${fmtTime(g.received_at)}, ${g.attempts} attempt${g.attempts === 1 ? '' : 's'}`,
        g.finished_at ? `, finished ${fmtTime(g.finished_at)}` : '', g.next_attempt_at ? `, next attempt ${fmtTime(g.next_attempt_at)}` : ''),
      g.history && g.history.length ? historyView(g.history) : null,
      // The last error in full, unless the history's last failure holds it.
      g.last_error && !(g.history || []).filter((h) => h.state !== 'pending').slice(-1).some((h) => h.error === g.last_error)
        ? el('pre', { title: 'the last error' }, (g.state === 'processed' ? 'earlier attempt: ' : 'last error: ') + g.last_error) : null,
      g.state === 'dead' ? el('div', { class: 'actions' },
        el('button', { class: 'primary', onclick: (e) => confirmAction(e.target.closest('li'), 'groups/' + encodeURIComponent(g.group) + '/redrive', { ids: [t.id] }, 'Redrive') }, 'Redrive'),
        el('button', { class: 'danger', onclick: (e) => confirmAction(e.target.closest('li'), 'groups/' + encodeURIComponent(g.group) + '/discard', { ids: [t.id] }, 'Discard') }, 'Discard')) : null));
  }
  out.push(el('h2', {}, 'Timeline'), el('ol', { class: 'timeline', id: 'timeline' }, steps));
  const headers = Object.entries(ev.headers || {}).sort(([a], [b]) => a.localeCompare(b));
  out.push(el('h2', {}, 'Headers'));
  out.push(headers.length ? el('table', { id: 'headers' }, el('tbody', {}, headers.map(([k, v]) => el('tr', {}, el('td', { class: 'mono' }, k), el('td', { class: 'mono' }, v))))) : el('p', { class: 'muted' }, 'None.'));
  out.push(el('h2', {}, 'Payload'), payloadView(ev));
  main.replaceChildren(...out);
  return !!t.outbox || t.groups.some((g) => g.state !== 'processed' && g.state !== 'dead');
}

function parkedRows(items) {
  return el('table', { id: 'parked' }, el('thead', {}, el('tr', {}, ['Key', 'Feed', 'State', 'Events waiting', 'Parked at', 'Last error'].map((h) => el('th', {}, h)))),
    el('tbody', {}, items.map((p) => el('tr', { dataset: { key: p.key } },
      el('td', { class: 'clip' }, keyLink(p.key)), el('td', {}, p.feed), el('td', {}, stateBadge(p.held ? 'held' : 'parked')),
      el('td', { class: 'num' }, p.queued.toLocaleString()), el('td', {}, fmtTime(p.parked_at)), el('td', { class: 'clip mono' }, p.reason || '')))));
}

async function parked(main) {
  const page = await get('parked?limit=500');
  const out = [el('h1', {}, 'Parked keys'),
    el('p', { class: 'muted' }, 'Keys whose destination stopped acknowledging them while other keys flowed: their events wait, in order, and go once it answers. ',
      'A held key gave up retrying (dead policy hold): `ferry parked release <key>` retries it, `ferry parked skip <key>` dead-letters its head.')];
  out.push(page.parked.length ? parkedRows(page.parked) : el('p', { class: 'muted', id: 'empty' }, 'No key is parked.'));
  main.replaceChildren(...out);
  return true;
}

// keyPage shows where one key stands: at the relay, in its dead letters,
// and in each group (what holds it, then what waits behind).
async function keyPage(main, key) {
  const [k, groups] = await Promise.all([get('keys/' + encodeURIComponent(key)), get('groups').catch(() => ({ groups: [] }))]);
  const out = [el('h1', {}, 'Key ', el('span', { class: 'mono', id: 'key-name' }, k.key))];
  out.push(el('h2', {}, 'At the relay'));
  out.push(k.parked.length ? parkedRows(k.parked) : el('p', { class: 'muted' }, 'Not parked: its events go as they commit.'));
  out.push(el('h2', {}, 'Relay dead letters'));
  out.push(k.dead_letters.length ? el('table', {}, el('tbody', {}, k.dead_letters.map((d) => el('tr', {},
    el('td', {}, eventLink(d.event.id)), el('td', { class: 'num' }, '#' + d.event.seq), el('td', {}, d.event.type), el('td', {}, fmtTime(d.failed_at)), el('td', { class: 'clip mono' }, d.reason)))))
    : el('p', { class: 'muted' }, 'None.'));
  out.push(el('h2', {}, 'Consumer groups'));
  if (k.groups.length === 0) out.push(el('p', { class: 'muted' }, 'Nothing unfinished in any group: every event of this key that arrived was processed (or discarded).'));
  for (const g of k.groups) {
    out.push(el('h3', {}, link('#/groups/' + encodeURIComponent(g.group), g.group), g.more ? el('span', { class: 'muted' }, ' (more wait than shown)') : null));
    out.push(el('table', { dataset: { group: g.group } }, el('thead', {}, el('tr', {}, ['Event', 'Seq', 'Type', 'State', 'Attempts', 'Received', 'Last error'].map((h) => el('th', {}, h)))),
      el('tbody', {}, g.events.map((r) => el('tr', { dataset: { id: r.event.id } },
        el('td', {}, eventLink(r.event.id)), el('td', { class: 'num' }, r.event.seq), el('td', {}, r.event.type), el('td', {}, stateBadge(r.state)),
        el('td', { class: 'num' }, r.attempts), el('td', {}, fmtTime(r.received_at)), el('td', { class: 'clip mono' }, r.last_error || ''))))));
  }
  // What the groups finished of the key: no index leads there by key, so
  // each group's page of PROCESSED events matches the key over the events
  // it reads, and pages on.
  if (groups.groups && groups.groups.length) {
    out.push(el('h2', {}, 'Processed'));
    out.push(el('p', { id: 'key-processed' }, el('span', { class: 'muted' }, 'This key’s processed events, newest first, in '),
      groups.groups.map((g, i) => [i ? ', ' : '', link('#/groups/' + encodeURIComponent(g.group) + '?' + new URLSearchParams({ state: 'processed', key: k.key }), g.group)])));
  }
  main.replaceChildren(...out);
  return k.groups.length > 0 || k.parked.length > 0;
}

// ---- routing ----

let timer;
let lastStatus; // of the page's failed request, if it failed
let generation = 0; // of the page shown: a slower, older load must not replace a newer page

// takeToken keeps the token of an address `ferry ui` printed (in the
// fragment, which the browser never sends to the server) for this tab,
// and takes it out of the address.
function takeToken() {
  const m = location.hash.match(/^#token=([^&]*)/);
  if (!m) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
  history.replaceState(null, '', location.pathname + '#/');
  showToken();
}

async function route() {
  clearTimeout(timer);
  takeToken();
  const mine = ++generation;
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  document.querySelectorAll('nav a').forEach((a) => a.classList.toggle('active',
    (a.dataset.nav === 'overview' && parts.length === 0) || a.dataset.nav === parts[0]));
  // The page is built off-screen and shown only if no newer navigation
  // started meanwhile.
  const main = document.createElement('div');
  let poll = false;
  try {
    if (parts.length === 0) poll = await overview(main);
    else if (parts[0] === 'dead-letters') poll = await deadLetters(main, params);
    else if (parts[0] === 'groups' && parts[1]) poll = await group(main, parts[1], params);
    else if (parts[0] === 'events' && parts[1]) poll = await eventPage(main, parts[1]).catch((e) => {
      // An ID that names no event may be a key that looks like one.
      if (e.status === 404) e.key = parts[1];
      throw e;
    });
    else if (parts[0] === 'keys' && parts[1]) poll = await keyPage(main, parts.slice(1).join('/'));
    else if (parts[0] === 'parked') poll = await parked(main);
    else main.replaceChildren(el('p', {}, 'No such page. ', link('#/', 'Overview')));
    document.title = 'Ferry console · ' + (parts[0] || 'overview');
  } catch (e) {
    lastStatus = e.status;
    main.replaceChildren(el('p', { class: 'muted', id: 'error' }, e.message),
      e.key ? el('p', {}, link('#/keys/' + encodeURIComponent(e.key), 'Look for a key named ', el('span', { class: 'mono' }, e.key))) : null);
    poll = true;
  }
  if (mine !== generation) return;
  document.getElementById('main').replaceChildren(...main.childNodes);
  // A page that was not found is looked for again, slowly (an event not
  // found yet may arrive; its lookup reads the outbox's backlog).
  if (poll) timer = setTimeout(route, main.querySelector('#error') && lastStatus === 404 ? POLL_MS * 10 : POLL_MS);
}

function showToken() {
  document.getElementById('token-state').textContent = token() ? 'token set' : 'reads and actions need the token';
}

function init() {
  document.getElementById('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const input = document.getElementById('token');
    if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    else sessionStorage.removeItem(TOKEN_KEY);
    input.value = '';
    showToken();
    route();
  });
  showToken();
  document.getElementById('search').addEventListener('submit', search);
  window.addEventListener('hashchange', route);
  route();
}

document.addEventListener('DOMContentLoaded', init);
