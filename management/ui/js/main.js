/*
 * Shoal management UI: a small single-page app over the management HTTP API.
 *
 * It reads and writes only /api/... (RabbitMQ's management API shapes), with HTTP basic auth:
 * the login form keeps "user:password" (base64) in sessionStorage, for this tab only, and every
 * request sends it as an Authorization header, as RabbitMQ's UI does. Pages are routed on the
 * URL's hash (#/queues/%2F/name, as RabbitMQ's) and refresh every 5 s; forms are built once per
 * page and only the data around them is redrawn, so a refresh never loses what is being typed.
 */
'use strict';

(function () {
  const REFRESH_MS = 5000;
  const HISTORY_MS = 10 * 60 * 1000; // what the charts keep and show
  const AUTH_KEY = 'shoal.auth';
  const USER_KEY = 'shoal.user';
  const Charts = window.ShoalCharts;

  const S = {
    auth: sessionStorage.getItem(AUTH_KEY),
    user: sessionStorage.getItem(USER_KEY),
    page: null,
    timer: null,
    busy: false,
    overview: null,
    exchangeTypes: ['direct', 'fanout', 'headers', 'topic'],
    history: [], // [{t, values}] from /api/overview
  };

  // ------------------------------------------------------------------ small helpers

  const $ = id => document.getElementById(id);
  const enc = encodeURIComponent;

  /* h('tag', {class, text, id, attrs..., onclick}, ...children): an element, text set safely. */
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k in el && typeof v !== 'string') el[k] = v;
      else el.setAttribute(k, v === true ? '' : v);
    }
    append(el, children);
    return el;
  }

  function append(el, ...children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function fill(el, ...children) {
    el.replaceChildren();
    return append(el, children);
  }

  function num(n) {
    return typeof n === 'number' ? n.toLocaleString('en-US') : '–';
  }

  function rate(details) {
    const r = details && typeof details.rate === 'number' ? details.rate : 0;
    return (Math.abs(r) >= 100 ? r.toFixed(0) : r.toFixed(1)) + '/s';
  }

  function bytes(n) {
    if (typeof n !== 'number') return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + ' ' + units[i];
  }

  function duration(ms) {
    let s = Math.floor((ms || 0) / 1000);
    const d = Math.floor(s / 86400); s -= d * 86400;
    const hh = Math.floor(s / 3600); s -= hh * 3600;
    const mm = Math.floor(s / 60); s -= mm * 60;
    if (d) return `${d}d ${hh}h`;
    if (hh) return `${hh}h ${mm}m`;
    if (mm) return `${mm}m ${s}s`;
    return `${s}s`;
  }

  function clock(date) {
    return date.toLocaleTimeString('en-GB', {hour12: false});
  }

  function stamp(ms) {
    if (!ms) return '–';
    const d = new Date(ms);
    return d.toISOString().slice(0, 10) + ' ' + clock(d);
  }

  function json(value) {
    return value && Object.keys(value).length ? JSON.stringify(value) : '';
  }

  function base64(text) {
    let bin = '';
    for (const b of new TextEncoder().encode(text)) bin += String.fromCharCode(b);
    return btoa(bin);
  }

  function parseObject(text, what) {
    if (!text.trim()) return {};
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      throw new Error(`${what} is not JSON: ${e.message}`);
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
      throw new Error(`${what} must be a JSON object, as {"key": "value"}`);
    }
    return value;
  }

  function exchangeLabel(name) {
    return name === '' ? '(AMQP default)' : name;
  }

  function exchangePath(name) {
    return name === '' ? 'amq.default' : name;
  }

  const queueHref = (vhost, name) => `#/queues/${enc(vhost)}/${enc(name)}`;
  const exchangeHref = (vhost, name) => `#/exchanges/${enc(vhost)}/${enc(exchangePath(name))}`;
  const queueApi = (vhost, name) => `/api/queues/${enc(vhost)}/${enc(name)}`;
  const exchangeApi = (vhost, name) => `/api/exchanges/${enc(vhost)}/${enc(exchangePath(name))}`;

  // ------------------------------------------------------------------ the HTTP API

  class ApiError extends Error {
    constructor(status, error, reason) {
      super(reason || error || `HTTP ${status}`);
      this.status = status;
      this.error = error;
    }
  }

  /* One API call. credentials: 'omit' keeps the browser's own login prompt away on a 401:
     the Authorization header is ours, set on every request. */
  async function api(method, path, body, extraHeaders) {
    const headers = Object.assign({Authorization: 'Basic ' + S.auth}, extraHeaders || {});
    const init = {method, headers, credentials: 'omit', cache: 'no-store'};
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = typeof body === 'string' ? body : JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, 'unreachable', `the broker does not answer (${e.message})`);
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (e) { data = {reason: text}; }
    }
    if (!response.ok) {
      throw new ApiError(response.status, data && data.error, data && data.reason);
    }
    return data;
  }

  // ------------------------------------------------------------------ login, logout

  function showLogin(message) {
    stopTimer();
    $('app').hidden = true;
    $('login').hidden = false;
    const err = $('login-error');
    err.hidden = !message;
    err.textContent = message || '';
    $('login-username').focus();
  }

  function logout(message) {
    S.auth = null;
    S.user = null;
    sessionStorage.removeItem(AUTH_KEY);
    sessionStorage.removeItem(USER_KEY);
    showLogin(message);
  }

  async function login(user, password) {
    S.auth = base64(`${user}:${password}`);
    let me;
    try {
      me = await api('GET', '/api/whoami');
    } catch (e) {
      S.auth = null;
      showLogin(e.status === 401 ? 'Login failed: wrong username or password (guest logs in from localhost only).'
        : `Login failed: ${e.message}`);
      return;
    }
    S.user = me.name;
    sessionStorage.setItem(AUTH_KEY, S.auth);
    sessionStorage.setItem(USER_KEY, S.user);
    showApp();
  }

  function showApp() {
    $('login').hidden = true;
    $('app').hidden = false;
    $('fact-user').textContent = S.user || '–';
    route();
  }

  // ------------------------------------------------------------------ flash, errors

  let flashTimer = null;
  let flashAt = 0;

  function flash(text, kind) {
    flashAt = Date.now();
    const el = $('flash');
    el.className = 'flash ' + (kind || 'ok');
    el.textContent = text;
    el.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { el.hidden = true; }, 10000);
  }

  /* An action's error: a 401 ends the session, anything else is said where the action is. */
  function failed(e, where) {
    if (e.status === 401 && e.message === 'Login failed') {
      logout('Your login is no longer accepted: log in again.');
      return;
    }
    if (where) {
      where.className = 'result error';
      where.textContent = e.message;
    } else {
      flash(e.message, 'error');
    }
  }

  function result(where, text) {
    where.className = 'result ok';
    where.textContent = text;
  }

  /* A button that runs an async action once at a time. */
  function action(label, fn, props) {
    const button = h('button', Object.assign({type: 'button', text: label}, props || {}));
    button.addEventListener('click', async () => {
      if (button.disabled) return;
      button.disabled = true;
      try { await fn(); } finally { button.disabled = false; }
    });
    return button;
  }

  // ------------------------------------------------------------------ building blocks

  function section(title, ...children) {
    return h('section', {class: 'panel'}, title ? h('h2', {text: title}) : null, ...children);
  }

  /* columns: [{label, cell: row => node|text, class}]; rows: the API's objects. */
  function table(columns, rows, props) {
    const p = props || {};
    const head = h('thead', {}, h('tr', {}, columns.map(c => h('th', {class: c.class, text: c.label}))));
    const body = h('tbody');
    if (!rows.length) {
      body.appendChild(h('tr', {class: 'empty'},
        h('td', {colspan: String(columns.length), text: p.empty || '… no items …'})));
    }
    for (const row of rows) {
      const tr = h('tr', {dataset: p.key ? {name: p.key(row)} : undefined});
      for (const c of columns) tr.appendChild(h('td', {class: c.class}, c.cell(row)));
      body.appendChild(tr);
    }
    return h('table', {class: 'list', id: p.id}, head, body);
  }

  function facts(pairs, id) {
    return h('table', {class: 'facts-table', id},
      h('tbody', {}, pairs.filter(Boolean).map(([k, v, cls]) => h('tr', {},
        h('th', {text: k}), h('td', {class: cls}, v)))));
  }

  function badge(text, title, kind) {
    return h('abbr', {class: 'badge ' + (kind || ''), title, text});
  }

  function features(item) {
    const out = [];
    if (item.durable) out.push(badge('D', 'durable'));
    if (item.auto_delete) out.push(badge('AD', 'auto-delete'));
    if (item.exclusive) out.push(badge('Excl', 'exclusive'));
    if (item.internal) out.push(badge('I', 'internal'));
    for (const [k, v] of Object.entries(item.arguments || {})) {
      out.push(badge(k.replace(/^x-/, ''), `${k}: ${JSON.stringify(v)}`, 'arg'));
    }
    return out;
  }

  function field(label, input, hint) {
    return h('label', {class: 'field'}, h('span', {class: 'label', text: label}), input,
      hint ? h('span', {class: 'hint', text: hint}) : null);
  }

  function wide(el) {
    el.classList.add('wide');
    return el;
  }

  function select(id, options, value) {
    return h('select', {id}, options.map(([v, text]) =>
      h('option', {value: v, text, selected: v === value})));
  }

  function legend(items) {
    return h('ul', {class: 'legend'}, items.map(([color, label, value]) =>
      h('li', {}, h('span', {class: 'swatch', style: `background:${color}`}),
        h('span', {class: 'legend-label', text: label}), h('span', {class: 'legend-value', text: value}))));
  }

  function filterBox(onInput) {
    const input = h('input', {type: 'search', placeholder: 'Filter by name', class: 'filter',
                              'aria-label': 'Filter by name'});
    input.addEventListener('input', onInput);
    return input;
  }

  // ------------------------------------------------------------------ the overview

  const QUEUED = [
    {key: 'ready', label: 'Ready', color: '#e0a000'},
    {key: 'unacked', label: 'Unacked', color: '#5b8def'},
    {key: 'total', label: 'Total', color: '#0b6e79', dash: '6 4'}, // dashed: it often lies on Ready
  ];
  const RATES = [{key: 'publish', label: 'Publish (into queues)', color: '#c2410c'}];

  function remember(history, values) {
    const t = Date.now();
    history.push({t, values});
    while (history.length && history[0].t < t - HISTORY_MS) history.shift();
  }

  function overviewPage() {
    const totals = h('div', {class: 'totals', id: 'totals'});
    const queuedChart = h('div', {class: 'chart-box', id: 'chart-queued'});
    const queuedLegend = h('div');
    const ratesChart = h('div', {class: 'chart-box', id: 'chart-rates'});
    const ratesLegend = h('div');
    const node = h('div', {id: 'node'});
    const listeners = h('div');
    const importResult = h('p', {class: 'result'});
    const exportResult = h('p', {class: 'result'});
    const file = h('input', {type: 'file', id: 'definitions-file', accept: '.json,application/json'});

    async function download() {
      try {
        const defs = await api('GET', '/api/definitions');
        const blob = new Blob([JSON.stringify(defs, null, 2)], {type: 'application/json'});
        const a = h('a', {href: URL.createObjectURL(blob),
                          download: `shoal_definitions_${new Date().toISOString().slice(0, 10)}.json`});
        document.body.appendChild(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(a.href), 10000);
        result(exportResult, `Exported ${defs.queues.length} queues, ${defs.exchanges.length} exchanges, ` +
          `${defs.bindings.length} bindings.`);
      } catch (e) { failed(e, exportResult); }
    }

    async function upload() {
      const f = file.files && file.files[0];
      if (!f) { failed(new Error('Choose a definitions file (JSON) first.'), importResult); return; }
      try {
        const text = await f.text();
        parseObject(text, 'The file');
        await api('POST', '/api/definitions', text);
        result(importResult, `Imported ${f.name}: exchanges, queues and bindings declared.`);
        refreshSoon();
      } catch (e) { failed(e, importResult); }
    }

    return {
      tab: 'overview',
      title: 'Overview',
      build: main => append(main,
        h('h1', {text: 'Overview'}),
        totals,
        h('div', {class: 'two-col'},
          section('Queued messages', h('p', {class: 'sub', text: 'up to ten minutes back, a sample every 5 s'}),
            queuedChart, queuedLegend),
          section('Message rates', h('p', {class: 'sub', text: 'messages entering queues, per second, up to ten minutes back'}),
            ratesChart, ratesLegend)),
        section('Node', node),
        section('Ports and contexts', listeners),
        h('div', {class: 'two-col'},
          section('Export definitions',
            h('p', {class: 'sub', text: 'Exchanges, queues, bindings, users, vhosts and permissions, as JSON.'}),
            action('Download broker definitions', download, {id: 'definitions-export'}), exportResult),
          section('Import definitions',
            h('p', {class: 'sub', text: 'Declares the file\'s exchanges, queues and bindings.'}),
            h('div', {class: 'row'}, file,
              action('Upload broker definitions', upload, {id: 'definitions-import'})), importResult))),
      refresh: async () => {
        const o = S.overview || await refreshOverview();
        const [n] = await api('GET', '/api/nodes');
        const ot = o.object_totals || {};
        const qt = o.queue_totals || {};
        fill(totals,
          [['Connections', ot.connections, '#/connections'], ['Channels', ot.channels, '#/channels'],
           ['Exchanges', ot.exchanges, '#/exchanges'], ['Queues', ot.queues, '#/queues'],
           ['Consumers', ot.consumers, '#/queues'], ['Ready', qt.messages_ready, '#/queues'],
           ['Unacked', qt.messages_unacknowledged, '#/queues'], ['Total', qt.messages, '#/queues']]
            .map(([label, value, href]) => h('a', {class: 'total', href,
                                                   dataset: {total: label.toLowerCase()}},
              h('span', {class: 'total-value', text: num(value)}), h('span', {class: 'total-label', text: label}))));
        Charts.lineChart(queuedChart, S.history, QUEUED, {windowMs: HISTORY_MS, integer: true});
        fill(queuedLegend, legend([
          [QUEUED[0].color, 'Ready', num(qt.messages_ready)],
          [QUEUED[1].color, 'Unacked', num(qt.messages_unacknowledged)],
          [QUEUED[2].color, 'Total', num(qt.messages)]]));
        Charts.lineChart(ratesChart, S.history, RATES, {windowMs: HISTORY_MS, unit: '/s'});
        const ms = o.message_stats || {};
        fill(ratesLegend, legend([[RATES[0].color, 'Publish (into queues)', rate(ms.publish_details)]]),
          h('p', {class: 'note', text: 'Delivery, acknowledgement and confirm rates are not counted by Shoal yet.'}));
        const alarms = [];
        if (n.mem_alarm) alarms.push(badge('memory alarm', 'publishers are blocked: memory high watermark', 'alarm'));
        if (n.disk_free_alarm) alarms.push(badge('disk alarm', 'publishers are blocked: disk free limit', 'alarm'));
        fill(node, facts([
          ['Name', n.name],
          ['Alarms', alarms.length ? alarms : badge('none', 'no resource alarm in effect', 'good'), 'alarms'],
          ['Uptime', duration(n.uptime)],
          ['Memory used', bytes(n.mem_used)],
          ['Disk free', bytes(n.disk_free)],
          ['Processors', num(n.processors)],
          ['Version', `${o.product_name || 'Shoal'} ${o.product_version || ''} (Python ${o.erlang_version})`],
        ], 'node-facts'));
        fill(listeners, table([
          {label: 'Protocol', cell: l => l.protocol},
          {label: 'Bound to', cell: l => l.ip_address || '(all)'},
          {label: 'Port', cell: l => String(l.port), class: 'num'},
        ], o.listeners || []));
      },
    };
  }

  async function refreshOverview() {
    const o = await api('GET', '/api/overview');
    S.overview = o;
    if (Array.isArray(o.exchange_types) && o.exchange_types.length) {
      S.exchangeTypes = o.exchange_types.map(t => t.name).sort();
    }
    $('fact-version').textContent = `${o.product_name || 'Shoal'} ${o.product_version || ''}`;
    $('fact-cluster').textContent = o.cluster_name || o.node || '–';
    const qt = o.queue_totals || {};
    const ms = o.message_stats || {};
    remember(S.history, {
      ready: qt.messages_ready || 0, unacked: qt.messages_unacknowledged || 0, total: qt.messages || 0,
      publish: (ms.publish_details && ms.publish_details.rate) || 0,
    });
    return o;
  }

  // ------------------------------------------------------------------ connections, channels

  function connectionsPage() {
    const holder = h('div', {id: 'connections'});
    const count = h('span', {class: 'count'});
    let rows = [];
    let filter = '';
    const draw = () => {
      const shown = rows.filter(c => c.name.toLowerCase().includes(filter));
      count.textContent = `${shown.length} of ${rows.length}`;
      fill(holder, table([
        {label: 'Name', cell: c => c.name, class: 'name'},
        {label: 'User', cell: c => c.user},
        {label: 'State', cell: c => h('span', {class: 'state ' + c.state, text: c.state})},
        {label: 'Protocol', cell: c => c.protocol},
        {label: 'Client', cell: c => (c.client_properties || {}).product || ''},
        {label: 'Channels', cell: c => num(c.channels), class: 'num'},
        {label: 'From client', cell: c => bytes(c.recv_oct_details && c.recv_oct_details.rate) + '/s', class: 'num'},
        {label: 'To client', cell: c => bytes(c.send_oct_details && c.send_oct_details.rate) + '/s', class: 'num'},
        {label: 'Connected at', cell: c => stamp(c.connected_at)},
        {label: '', cell: c => action('Close', async () => {
          if (!confirm(`Close connection ${c.name}?`)) return;
          try {
            await api('DELETE', `/api/connections/${enc(c.name)}`, undefined,
              {'X-Reason': 'Closed via management UI'});
            flash(`Connection ${c.name} closed.`);
            refreshSoon();
          } catch (e) { failed(e); }
        }, {class: 'small danger'})},
      ], shown, {key: c => c.name, empty: '… no connections …'}));
    };
    return {
      tab: 'connections',
      title: 'Connections',
      build: main => append(main, h('h1', {text: 'Connections'}),
        section(null, h('div', {class: 'toolbar'}, filterBox(e => { filter = e.target.value.toLowerCase(); draw(); }),
          count), holder)),
      refresh: async () => { rows = await api('GET', '/api/connections'); draw(); },
    };
  }

  function channelsPage() {
    const holder = h('div', {id: 'channels'});
    return {
      tab: 'channels',
      title: 'Channels',
      build: main => append(main, h('h1', {text: 'Channels'}),
        section(null, h('p', {class: 'note', text:
          'Shoal lists the channels it keeps books for: those with a consumer or an unacknowledged delivery.'}),
        holder)),
      refresh: async () => {
        const rows = await api('GET', '/api/channels');
        fill(holder, table([
          {label: 'Channel', cell: c => c.name, class: 'name'},
          {label: 'User', cell: c => c.user},
          {label: 'State', cell: c => c.state},
          {label: 'Consumers', cell: c => num(c.consumer_count), class: 'num'},
          {label: 'Unacked', cell: c => num(c.messages_unacknowledged), class: 'num'},
          {label: 'Unconfirmed', cell: c => num(c.messages_unconfirmed), class: 'num'},
        ], rows, {key: c => c.name, empty: '… no channels …'}));
      },
    };
  }

  // ------------------------------------------------------------------ exchanges

  function exchangesPage() {
    const holder = h('div', {id: 'exchanges'});
    const count = h('span', {class: 'count'});
    const out = h('p', {class: 'result'});
    const name = h('input', {id: 'exchange-name', type: 'text', required: true});
    const type = select('exchange-type', S.exchangeTypes.map(t => [t, t]), 'direct');
    const durable = select('exchange-durable', [['true', 'Durable'], ['false', 'Transient']], 'true');
    const autoDelete = select('exchange-auto-delete', [['false', 'No'], ['true', 'Yes']], 'false');
    const internal = select('exchange-internal', [['false', 'No'], ['true', 'Yes']], 'false');
    const args = h('textarea', {id: 'exchange-arguments', rows: '2', placeholder: '{"alternate-exchange": "unrouted"}'});
    let rows = [];
    let filter = '';
    const draw = () => {
      const shown = rows.filter(x => exchangeLabel(x.name).toLowerCase().includes(filter));
      count.textContent = `${shown.length} of ${rows.length}`;
      fill(holder, table([
        {label: 'Name', cell: x => h('a', {href: exchangeHref(x.vhost, x.name), text: exchangeLabel(x.name)}),
         class: 'name'},
        {label: 'Virtual host', cell: x => x.vhost},
        {label: 'Type', cell: x => x.type},
        {label: 'Features', cell: features},
      ], shown, {key: x => x.name, empty: '… no exchanges …', id: 'exchanges-table'}));
    };
    async function add() {
      try {
        if (!name.value.trim()) throw new Error('Give the exchange a name.');
        await api('PUT', exchangeApi('/', name.value), {
          type: type.value, durable: durable.value === 'true', auto_delete: autoDelete.value === 'true',
          internal: internal.value === 'true', arguments: parseObject(args.value, 'Arguments')});
        result(out, `Exchange ${name.value} declared.`);
        name.value = '';
        refreshSoon();
      } catch (e) { failed(e, out); }
    }
    return {
      tab: 'exchanges',
      title: 'Exchanges',
      build: main => append(main, h('h1', {text: 'Exchanges'}),
        section(null, h('div', {class: 'toolbar'},
          filterBox(e => { filter = e.target.value.toLowerCase(); draw(); }), count), holder),
        section('Add a new exchange', h('div', {class: 'form-grid'},
          field('Name', name), field('Type', type), field('Durability', durable),
          field('Auto delete', autoDelete), field('Internal', internal),
          field('Arguments (JSON)', args)),
        h('div', {class: 'row'}, action('Add exchange', add, {id: 'exchange-add'}), out))),
      refresh: async () => { rows = await api('GET', '/api/exchanges'); draw(); },
    };
  }

  function publishForm(prefix, vhost, exchange, fixedKey) {
    const out = h('p', {class: 'result', id: `${prefix}-result`});
    const key = h('input', {id: `${prefix}-routing-key`, type: 'text', value: fixedKey || ''});
    const mode = select(`${prefix}-delivery-mode`, [['1', '1 - Non-persistent'], ['2', '2 - Persistent']], '1');
    const headers = h('textarea', {id: `${prefix}-headers`, rows: '2', placeholder: '{"x-header": "value"}'});
    const props = h('textarea', {id: `${prefix}-properties`, rows: '2',
                                 placeholder: '{"content_type": "text/plain", "message_id": "m1"}'});
    const payload = h('textarea', {id: `${prefix}-payload`, rows: '4', class: 'payload-input'});
    async function publish() {
      try {
        const properties = parseObject(props.value, 'Properties');
        properties.delivery_mode = Number(mode.value);
        const hdrs = parseObject(headers.value, 'Headers');
        if (Object.keys(hdrs).length) properties.headers = hdrs;
        const answer = await api('POST', `${exchangeApi(vhost, exchange)}/publish`, {
          routing_key: fixedKey === undefined ? key.value : fixedKey, payload: payload.value,
          payload_encoding: 'string', properties});
        result(out, answer.routed ? 'Message published.' : 'Message published, but not routed.');
        if (!answer.routed) out.className = 'result warn';
        refreshSoon();
      } catch (e) { failed(e, out); }
    }
    return section('Publish message',
      fixedKey !== undefined ? h('p', {class: 'sub',
        text: `Published through the default exchange with routing key ${fixedKey}, so it goes to this queue.`})
        : null,
      h('div', {class: 'form-grid'},
        fixedKey === undefined ? field('Routing key', key) : null,
        field('Delivery mode', mode), field('Headers (JSON)', headers), field('Properties (JSON)', props),
        wide(field('Payload', payload))),
      h('div', {class: 'row'}, action('Publish message', publish, {id: `${prefix}-submit`}), out));
  }

  function exchangePage(vhost, name) {
    const details = h('div', {id: 'exchange-details'});
    const bindings = h('div', {id: 'exchange-bindings'});
    const bindOut = h('p', {class: 'result'});
    const deleteOut = h('p', {class: 'result'});
    const destType = select('bind-dest-type', [['q', 'To queue'], ['e', 'To exchange']], 'q');
    const dest = h('input', {id: 'bind-destination', type: 'text'});
    const key = h('input', {id: 'bind-routing-key', type: 'text'});
    const args = h('textarea', {id: 'bind-arguments', rows: '2'});
    const builtin = name === '' || name.startsWith('amq.');
    async function bind() {
      try {
        if (!dest.value) throw new Error('Name the queue or exchange to bind to.');
        await api('POST', `/api/bindings/${enc(vhost)}/e/${enc(exchangePath(name))}/${destType.value}/${enc(dest.value)}`,
          {routing_key: key.value, arguments: parseObject(args.value, 'Arguments')});
        result(bindOut, `Bound to ${dest.value}.`);
        refreshSoon();
      } catch (e) { failed(e, bindOut); }
    }
    async function remove() {
      if (!confirm(`Delete exchange ${name}? This cannot be undone.`)) return;
      try {
        await api('DELETE', exchangeApi(vhost, name));
        flash(`Exchange ${name} deleted.`);
        location.hash = '#/exchanges';
      } catch (e) { failed(e, deleteOut); }
    }
    return {
      tab: 'exchanges',
      title: `Exchange ${exchangeLabel(name)}`,
      build: main => append(main,
        h('h1', {}, 'Exchange ', h('b', {text: exchangeLabel(name)}), h('small', {text: ` in virtual host ${vhost}`})),
        section('Details', details),
        section('Bindings', h('p', {class: 'sub', text: 'From this exchange'}), bindings,
          name === '' ? null : h('div', {},
            h('h3', {text: 'Add binding from this exchange'}),
            h('div', {class: 'form-grid'}, field('Destination', h('div', {class: 'row'}, destType, dest)),
              field('Routing key', key), field('Arguments (JSON)', args)),
            h('div', {class: 'row'}, action('Bind', bind, {id: 'bind-submit'}), bindOut))),
        publishForm('publish', vhost, name),
        builtin ? null : section('Delete this exchange',
          h('div', {class: 'row'}, action('Delete', remove, {id: 'exchange-delete', class: 'danger'}), deleteOut))),
      refresh: async () => {
        let x;
        try {
          x = await api('GET', exchangeApi(vhost, name));
        } catch (e) {
          if (e.status === 404) { fill(details, h('p', {class: 'error', text: 'This exchange does not exist (any more).'})); return; }
          throw e;
        }
        fill(details, facts([
          ['Type', x.type], ['Features', features(x)], ['Arguments', json(x.arguments) || '–'],
        ]));
        const rows = name === '' ? [] : await api('GET', `${exchangeApi(vhost, name)}/bindings/source`);
        fill(bindings, table([
          {label: 'To', cell: b => b.destination_type === 'queue'
            ? h('a', {href: queueHref(b.vhost, b.destination), text: b.destination})
            : h('a', {href: exchangeHref(b.vhost, b.destination), text: b.destination})},
          {label: 'Type', cell: b => b.destination_type},
          {label: 'Routing key', cell: b => b.routing_key},
          {label: 'Arguments', cell: b => json(b.arguments)},
          {label: '', cell: b => unbindButton(b)},
        ], rows, {empty: name === '' ? 'The default exchange binds every queue by its name.' : '… no bindings …'}));
      },
    };
  }

  function unbindButton(b) {
    if (b.source === '') return '';
    return action('Unbind', async () => {
      try {
        await api('DELETE', `/api/bindings/${enc(b.vhost)}/e/${enc(b.source)}/${b.destination_type === 'queue' ? 'q' : 'e'}` +
          `/${enc(b.destination)}/${enc(b.properties_key)}`);
        flash(`Unbound ${b.destination} from ${b.source}.`);
        refreshSoon();
      } catch (e) { failed(e); }
    }, {class: 'small'});
  }

  // ------------------------------------------------------------------ queues

  function queuesPage() {
    const holder = h('div', {id: 'queues'});
    const count = h('span', {class: 'count'});
    const out = h('p', {class: 'result'});
    const name = h('input', {id: 'queue-name', type: 'text'});
    const durable = select('queue-durable', [['true', 'Durable'], ['false', 'Transient']], 'true');
    const autoDelete = select('queue-auto-delete', [['false', 'No'], ['true', 'Yes']], 'false');
    const args = h('textarea', {id: 'queue-arguments', rows: '2', placeholder: '{"x-max-length": 10000}'});
    let rows = [];
    let filter = '';
    const draw = () => {
      const shown = rows.filter(q => q.name.toLowerCase().includes(filter));
      count.textContent = `${shown.length} of ${rows.length}`;
      fill(holder, table([
        {label: 'Name', cell: q => h('a', {href: queueHref(q.vhost, q.name), text: q.name}), class: 'name'},
        {label: 'Virtual host', cell: q => q.vhost},
        {label: 'Type', cell: q => q.type},
        {label: 'Features', cell: features},
        {label: 'State', cell: q => h('span', {class: 'state ' + q.state, text: q.state})},
        {label: 'Consumers', cell: q => num(q.consumers), class: 'num'},
        {label: 'Ready', cell: q => num(q.messages_ready), class: 'num c-ready'},
        {label: 'Unacked', cell: q => num(q.messages_unacknowledged), class: 'num c-unacked'},
        {label: 'Total', cell: q => num(q.messages), class: 'num c-total'},
        {label: 'Incoming', cell: q => rate((q.message_stats || {}).publish_details), class: 'num'},
      ], shown, {key: q => q.name, empty: '… no queues …', id: 'queues-table'}));
    };
    async function add() {
      try {
        if (!name.value.trim()) throw new Error('Give the queue a name.');
        await api('PUT', queueApi('/', name.value), {
          durable: durable.value === 'true', auto_delete: autoDelete.value === 'true',
          arguments: parseObject(args.value, 'Arguments')});
        result(out, `Queue ${name.value} declared.`);
        name.value = '';
        refreshSoon();
      } catch (e) { failed(e, out); }
    }
    return {
      tab: 'queues',
      title: 'Queues',
      build: main => append(main, h('h1', {text: 'Queues'}),
        section(null, h('div', {class: 'toolbar'},
          filterBox(e => { filter = e.target.value.toLowerCase(); draw(); }), count), holder),
        section('Add a new queue', h('div', {class: 'form-grid'},
          field('Name', name), field('Durability', durable), field('Auto delete', autoDelete),
          field('Arguments (JSON)', args)),
        h('div', {class: 'row'}, action('Add queue', add, {id: 'queue-add'}), out))),
      refresh: async () => { rows = await api('GET', '/api/queues'); draw(); },
    };
  }

  function messageView(m, i) {
    return h('div', {class: 'message', dataset: {index: String(i)}},
      h('h3', {text: `Message ${i + 1}`}),
      facts([
        ['Exchange', exchangeLabel(m.exchange)],
        ['Routing key', m.routing_key],
        ['Redelivered', String(m.redelivered)],
        ['Properties', h('code', {text: json(m.properties) || '–'})],
        ['Payload', h('div', {},
          h('span', {class: 'sub', text: `${m.payload_bytes} bytes, encoding: ${m.payload_encoding}`}),
          h('pre', {class: 'payload', text: m.payload}))],
      ]));
  }

  function queuePage(vhost, name) {
    const details = h('div', {id: 'queue-details'});
    const chart = h('div', {class: 'chart-box', id: 'chart-queue'});
    const chartLegend = h('div');
    const consumers = h('div', {id: 'queue-consumers'});
    const bindings = h('div', {id: 'queue-bindings'});
    const bindOut = h('p', {class: 'result'});
    const source = h('input', {id: 'bind-source', type: 'text', placeholder: 'amq.direct'});
    const key = h('input', {id: 'bind-routing-key', type: 'text'});
    const args = h('textarea', {id: 'bind-arguments', rows: '2'});
    const getOut = h('p', {class: 'result', id: 'get-result'});
    const messages = h('div', {id: 'get-messages'});
    const ackmode = select('get-ackmode', [
      ['ack_requeue_true', 'Nack message requeue true'], ['ack_requeue_false', 'Automatic ack'],
      ['reject_requeue_true', 'Reject requeue true'], ['reject_requeue_false', 'Reject requeue false']],
    'ack_requeue_true');
    const encoding = select('get-encoding', [['auto', 'Automatic string/base64'], ['base64', 'base64']], 'auto');
    const count = h('input', {id: 'get-count', type: 'number', min: '1', value: '1'});
    const dangerOut = h('p', {class: 'result', id: 'danger-result'});
    const history = [];
    let gone = false;

    async function bind() {
      try {
        if (!source.value) throw new Error('Name the exchange to bind from.');
        await api('POST', `/api/bindings/${enc(vhost)}/e/${enc(source.value)}/q/${enc(name)}`,
          {routing_key: key.value, arguments: parseObject(args.value, 'Arguments')});
        result(bindOut, `Bound from ${source.value}.`);
        refreshSoon();
      } catch (e) { failed(e, bindOut); }
    }
    async function get() {
      try {
        const got = await api('POST', `${queueApi(vhost, name)}/get`, {
          count: Math.max(1, Number(count.value) || 1), ackmode: ackmode.value, encoding: encoding.value,
          truncate: 50000});
        if (!got.length) {
          result(getOut, 'Queue is empty.');
          fill(messages);
        } else {
          result(getOut, `${got.length} message${got.length === 1 ? '' : 's'}; ` +
            `the server reported ${got[got.length - 1].message_count} messages remaining.`);
          fill(messages, got.map(messageView));
        }
        refreshSoon();
      } catch (e) { failed(e, getOut); }
    }
    async function purge() {
      if (!confirm(`Purge every message of queue ${name}?`)) return;
      try {
        await api('DELETE', `${queueApi(vhost, name)}/contents`);
        result(dangerOut, `Queue ${name} purged.`);
        refreshSoon();
      } catch (e) { failed(e, dangerOut); }
    }
    async function remove() {
      if (!confirm(`Delete queue ${name}? Its messages go with it.`)) return;
      try {
        await api('DELETE', queueApi(vhost, name));
        flash(`Queue ${name} deleted.`);
        location.hash = '#/queues';
      } catch (e) { failed(e, dangerOut); }
    }

    return {
      tab: 'queues',
      title: `Queue ${name}`,
      build: main => append(main,
        h('h1', {}, 'Queue ', h('b', {text: name, id: 'queue-title'}), h('small', {text: ` in virtual host ${vhost}`})),
        h('div', {class: 'two-col'},
          section('Details', details),
          section('Queued messages', h('p', {class: 'sub', text: 'since this page opened'}), chart, chartLegend)),
        section('Consumers', consumers),
        section('Bindings', bindings,
          h('h3', {text: 'Add binding to this queue'}),
          h('div', {class: 'form-grid'}, field('From exchange', source), field('Routing key', key),
            field('Arguments (JSON)', args)),
          h('div', {class: 'row'}, action('Bind', bind, {id: 'bind-submit'}), bindOut)),
        publishForm('publish', vhost, '', name),
        section('Get messages',
          h('p', {class: 'sub', text: 'Getting messages is destructive unless they are requeued (the first ack mode).'}),
          h('div', {class: 'form-grid'}, field('Ack mode', ackmode), field('Encoding', encoding),
            field('Messages', count)),
          h('div', {class: 'row'}, action('Get message(s)', get, {id: 'get-submit'}), getOut), messages),
        section('Delete or purge',
          h('div', {class: 'row'},
            action('Purge messages', purge, {id: 'queue-purge'}),
            action('Delete queue', remove, {id: 'queue-delete', class: 'danger'}), dangerOut))),
      refresh: async () => {
        let q;
        try {
          q = await api('GET', queueApi(vhost, name));
        } catch (e) {
          if (e.status === 404) {
            gone = true;
            fill(details, h('p', {class: 'error', text: 'This queue does not exist (any more).'}));
            return;
          }
          throw e;
        }
        gone = false;
        remember(history, {ready: q.messages_ready, unacked: q.messages_unacknowledged, total: q.messages});
        fill(details, facts([
          ['Features', features(q)],
          ['State', q.state],
          ['Consumers', num(q.consumers)],
          ['Ready', num(q.messages_ready), 'num'],
          ['Unacked', num(q.messages_unacknowledged), 'num'],
          ['Total', h('span', {id: 'queue-total', text: num(q.messages)}), 'num'],
          ['Published into', `${num((q.message_stats || {}).publish)} (${rate((q.message_stats || {}).publish_details)})`],
          ['Arguments', json(q.arguments) || '–'],
          q.owner_pid_details ? ['Exclusive owner', q.owner_pid_details.name] : null,
        ]));
        Charts.lineChart(chart, history, QUEUED, {windowMs: HISTORY_MS, height: 150, integer: true});
        fill(chartLegend, legend([
          [QUEUED[0].color, 'Ready', num(q.messages_ready)],
          [QUEUED[1].color, 'Unacked', num(q.messages_unacknowledged)],
          [QUEUED[2].color, 'Total', num(q.messages)]]));
        const [cs, bs] = await Promise.all([
          api('GET', `/api/consumers/${enc(vhost)}`), api('GET', `${queueApi(vhost, name)}/bindings`)]);
        fill(consumers, table([
          {label: 'Channel', cell: c => c.channel_details.name},
          {label: 'Consumer tag', cell: c => c.consumer_tag},
          {label: 'Ack required', cell: c => c.ack_required ? '●' : '○'},
          {label: 'Exclusive', cell: c => c.exclusive ? '●' : '○'},
          {label: 'Active', cell: c => c.activity_status},
          {label: 'Arguments', cell: c => json(c.arguments)},
        ], cs.filter(c => c.queue.name === name), {empty: '… no consumers …'}));
        fill(bindings, table([
          {label: 'From', cell: b => h('a', {href: exchangeHref(b.vhost, b.source), text: exchangeLabel(b.source)})},
          {label: 'Routing key', cell: b => b.routing_key},
          {label: 'Arguments', cell: b => json(b.arguments)},
          {label: '', cell: b => unbindButton(b)},
        ], bs));
      },
      isGone: () => gone,
    };
  }

  // ------------------------------------------------------------------ admin

  function adminPage() {
    const users = h('div', {id: 'admin-users'});
    const vhosts = h('div', {id: 'admin-vhosts'});
    const permissions = h('div', {id: 'admin-permissions'});
    const policies = h('div', {id: 'admin-policies'});
    return {
      tab: 'admin',
      title: 'Admin',
      build: main => append(main, h('h1', {text: 'Admin'}),
        h('p', {class: 'note', text: 'Read-only: Shoal cannot create or delete users, virtual hosts, ' +
          'permissions or policies over HTTP yet (users come from the broker\'s configuration).'}),
        section('Users', users),
        section('Virtual hosts', vhosts),
        section('Permissions', permissions),
        section('Policies', policies)),
      refresh: async () => {
        // a user who is not an administrator is refused some of these (403): say so in place
        const refused = [];
        const list = path => api('GET', path).catch(e => {
          if (e.status !== 403) throw e;
          refused.push(path);
          return [];
        });
        const [us, vs, ps, pol] = await Promise.all([
          list('/api/users'), list('/api/vhosts'), list('/api/permissions'), list('/api/policies')]);
        fill(users, table([
          {label: 'Name', cell: u => u.name, class: 'name'},
          {label: 'Tags', cell: u => (u.tags || []).join(', ')},
          {label: 'Can access virtual hosts', cell: u => ps.filter(p => p.user === u.name).map(p => p.vhost).join(', ')},
          {label: 'Has password', cell: u => u.password_hash ? '●' : '○'},
        ], us, {key: u => u.name, empty: refused.includes('/api/users')
          ? 'Only administrators may list users.' : '… no users …'}));
        fill(vhosts, table([
          {label: 'Name', cell: v => v.name, class: 'name'},
          {label: 'Description', cell: v => v.description || ''},
          {label: 'Ready', cell: v => num(v.messages_ready), class: 'num'},
          {label: 'Unacked', cell: v => num(v.messages_unacknowledged), class: 'num'},
          {label: 'Total', cell: v => num(v.messages), class: 'num'},
          {label: 'Publish', cell: v => rate((v.message_stats || {}).publish_details), class: 'num'},
        ], vs, {key: v => v.name}));
        fill(permissions, table([
          {label: 'User', cell: p => p.user}, {label: 'Virtual host', cell: p => p.vhost},
          {label: 'Configure regexp', cell: p => h('code', {text: p.configure})},
          {label: 'Write regexp', cell: p => h('code', {text: p.write})},
          {label: 'Read regexp', cell: p => h('code', {text: p.read})},
        ], ps));
        fill(policies, table([
          {label: 'Virtual host', cell: p => p.vhost}, {label: 'Name', cell: p => p.name},
          {label: 'Pattern', cell: p => p.pattern}, {label: 'Apply to', cell: p => p['apply-to']},
          {label: 'Definition', cell: p => json(p.definition)}, {label: 'Priority', cell: p => String(p.priority)},
        ], pol, {empty: '… no policies …'}));
      },
    };
  }

  // ------------------------------------------------------------------ routing, refreshing

  function decode(part) {
    try { return decodeURIComponent(part); } catch (e) { return part; }
  }

  function pageFor(hash) {
    const parts = hash.replace(/^#\/?/, '').split('/').filter((p, i) => p !== '' || i > 0).map(decode);
    const [tab, vhost, name] = parts;
    switch (tab) {
      case undefined: case '': case 'overview': return overviewPage();
      case 'connections': return connectionsPage();
      case 'channels': return channelsPage();
      case 'exchanges':
        return parts.length >= 3 ? exchangePage(vhost, name === 'amq.default' ? '' : name) : exchangesPage();
      case 'queues': return parts.length >= 3 ? queuePage(vhost, name) : queuesPage();
      case 'admin': return adminPage();
      default: return null;
    }
  }

  function route() {
    if (!S.auth) { showLogin(); return; }
    stopTimer();
    if (Date.now() - flashAt > 1500) $('flash').hidden = true; // a notice set for this page stays
    const page = pageFor(location.hash);
    const main = $('main');
    main.replaceChildren();
    if (!page) {
      S.page = null;
      append(main, h('h1', {text: 'Not found'}), h('p', {}, 'No such page: ', h('a', {href: '#/', text: 'back to the overview'})));
      return;
    }
    S.page = page;
    document.title = `${page.title} · Shoal Management`;
    for (const a of document.querySelectorAll('#tabs a')) a.classList.toggle('active', a.dataset.tab === page.tab);
    page.build(main);
    tick();
    S.timer = setInterval(tick, REFRESH_MS);
  }

  function stopTimer() {
    if (S.timer) clearInterval(S.timer);
    S.timer = null;
  }

  /* One refresh: the overview (header, charts' history), then the page's own data. */
  async function tick() {
    if (S.busy || !S.auth) return;
    S.busy = true;
    const page = S.page;
    const status = $('refresh-status');
    try {
      S.overview = null;
      await refreshOverview();
      if (page && page === S.page) await page.refresh();
      status.className = 'refresh-status';
      status.textContent = `Updated ${clock(new Date())} · every 5 s`;
      document.body.dataset.refreshed = String(Date.now());
    } catch (e) {
      if (e.status === 401) { logout('Your login is no longer accepted: log in again.'); return; }
      status.className = 'refresh-status error';
      status.textContent = `Update failed at ${clock(new Date())}: ${e.message}`;
    } finally {
      S.busy = false;
    }
  }

  /* After an action: show its effect now rather than at the next tick. */
  function refreshSoon() {
    if (S.busy) setTimeout(refreshSoon, 200);
    else tick();
  }

  // ------------------------------------------------------------------ start

  $('login-form').addEventListener('submit', e => {
    e.preventDefault();
    login($('login-username').value, $('login-password').value);
  });
  $('logout').addEventListener('click', () => logout());
  window.addEventListener('hashchange', route);

  if (S.auth) {
    api('GET', '/api/whoami')
      .then(me => { S.user = me.name; showApp(); })
      .catch(e => (e.status === 401 ? logout('Log in again.') : showLogin(`The broker does not answer: ${e.message}`)));
  } else {
    showLogin();
  }
})();
