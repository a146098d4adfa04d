/* Shoal management UI: line charts as inline SVG (no library). */
'use strict';

window.ShoalCharts = (function () {
  // An XML namespace name, not a location: nothing is fetched from it.
  const SVG_NS = 'http://www.w3.org/2000/svg';

  function svg(tag, attrs) {
    const el = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return el;
  }

  // The y axis's step: 1, 2, 2.5 or 5 × 10^n, at least v (a whole number for counts).
  function niceStep(v, integer) {
    if (!(v > 0)) return integer ? 1 : 0.25;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of integer ? [1, 2, 5, 10] : [1, 2, 2.5, 5, 10]) {
      if (m * p >= v) return integer ? Math.max(1, m * p) : m * p;
    }
    return 10 * p;
  }

  // The x axis's span: what the samples cover, in whole minutes, from one up to `most`.
  function span(samples, most) {
    if (samples.length < 2) return 60000;
    const covered = samples[samples.length - 1].t - samples[0].t;
    return Math.min(most, Math.max(60000, Math.ceil(covered / 60000) * 60000));
  }

  function shortNumber(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(a >= 1e10 ? 0 : 1) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + 'M';
    if (a >= 1e3) return (v / 1e3).toFixed(a >= 1e4 ? 0 : 1) + 'k';
    if (Number.isInteger(v)) return String(v);
    return v.toFixed(a < 1 ? 2 : 1);
  }

  /*
   * Draw a line chart into `container` (replacing what it held).
   * samples: [{t: ms since epoch, values: {key: number}}], oldest first.
   * series: [{key, label, color}]; opts: {windowMs (the most shown), height, unit, integer}.
   * The x axis covers the samples' span (one minute at least), so a page opened a minute ago
   * does not squeeze its lines against the right edge of a ten-minute axis.
   */
  function lineChart(container, samples, series, opts) {
    const o = Object.assign({windowMs: 10 * 60 * 1000, height: 170, unit: '', integer: false}, opts || {});
    const width = Math.max(280, Math.floor(container.clientWidth || 520));
    const height = o.height;
    const pad = {left: 44, right: 12, top: 10, bottom: 22};
    const plotW = width - pad.left - pad.right;
    const plotH = height - pad.top - pad.bottom;
    const now = samples.length ? samples[samples.length - 1].t : Date.now();
    const windowMs = span(samples.filter(s => s.t >= now - o.windowMs), o.windowMs);
    const start = now - windowMs;
    const shown = samples.filter(s => s.t >= start);

    let max = 0;
    for (const s of shown) for (const d of series) max = Math.max(max, Number(s.values[d.key]) || 0);
    const step = niceStep(max / 4, o.integer);
    const top = step * 4;
    const x = t => pad.left + plotW * (t - start) / windowMs;
    const y = v => pad.top + plotH * (1 - v / top);

    const root = svg('svg', {width, height, viewBox: `0 0 ${width} ${height}`, class: 'chart',
                             role: 'img', 'aria-label': series.map(d => d.label).join(', ')});
    // grid and y labels
    for (let i = 0; i <= 4; i++) {
      const v = step * i;
      const gy = y(v);
      root.appendChild(svg('line', {x1: pad.left, x2: width - pad.right, y1: gy, y2: gy,
                                    class: i === 0 ? 'axis' : 'grid'}));
      const label = svg('text', {x: pad.left - 6, y: gy + 4, 'text-anchor': 'end', class: 'tick'});
      label.textContent = shortNumber(v) + (i === 4 ? o.unit : '');
      root.appendChild(label);
    }
    // x labels: time back from the newest sample (15 s apart on a minute or two, else minutes)
    const tick = windowMs <= 120000 ? 15000 : windowMs <= 300000 ? 60000 : 120000;
    for (let back = 0; back <= windowMs; back += tick) {
      const label = svg('text', {x: x(now - back), y: height - 6,
                                 'text-anchor': back === 0 ? 'end' : back === windowMs ? 'start' : 'middle',
                                 class: 'tick'});
      label.textContent = back === 0 ? 'now' : tick < 60000 ? `-${back / 1000} s` : `-${back / 60000} min`;
      root.appendChild(label);
    }
    // the lines (a dot for a line of one sample)
    for (const d of series) {
      const pts = shown.filter(s => typeof s.values[d.key] === 'number')
        .map(s => [x(s.t), y(s.values[d.key])]);
      if (pts.length === 1) {
        root.appendChild(svg('circle', {cx: pts[0][0], cy: pts[0][1], r: 3, fill: d.color,
                                        class: 'series', 'data-series': d.key}));
      } else if (pts.length > 1) {
        root.appendChild(svg('polyline', {
          points: pts.map(p => p[0].toFixed(1) + ',' + p[1].toFixed(1)).join(' '),
          fill: 'none', stroke: d.color, 'stroke-width': 2, 'stroke-linejoin': 'round',
          'stroke-dasharray': d.dash || 'none', class: 'series', 'data-series': d.key}));
      }
    }
    if (!shown.length) {
      const t = svg('text', {x: pad.left + plotW / 2, y: pad.top + plotH / 2, 'text-anchor': 'middle',
                             class: 'empty'});
      t.textContent = 'waiting for the first sample';
      root.appendChild(t);
    }
    container.replaceChildren(root);
  }

  return {lineChart, shortNumber};
})();
