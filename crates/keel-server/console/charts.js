// Small SVG charts drawn by hand: bars (stacked) and lines over labelled points, with
// axes, a legend and a <title> per mark for its value.

import { h, s } from "./render.js";

const W = 720;
const H = 240;
const PAD = { left: 56, right: 12, top: 12, bottom: 34 };

function niceMax(max) {
  if (max <= 0) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(max)));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= max) return step * power;
  return 10 * power;
}

function axes(svg, labels, max, format) {
  const plotH = H - PAD.top - PAD.bottom;
  for (let i = 0; i <= 4; i++) {
    const y = PAD.top + plotH - (plotH * i) / 4;
    svg.append(s("line", { class: "gridline", x1: PAD.left, x2: W - PAD.right, y1: y, y2: y }));
    svg.append(s("text", { class: "axis", x: PAD.left - 6, y: y + 4, "text-anchor": "end" }, format((max * i) / 4)));
  }
  const plotW = W - PAD.left - PAD.right;
  const every = Math.max(1, Math.ceil(labels.length / 8));
  labels.forEach((label, i) => {
    if (i % every) return;
    const x = PAD.left + (plotW * (i + 0.5)) / labels.length;
    svg.append(s("text", { class: "axis", x, y: H - PAD.bottom + 16, "text-anchor": "middle" }, label));
  });
}

function legend(series) {
  return h(
    "div",
    { class: "legend" },
    series.map((one, i) => h("span", {}, h("i", { class: `series-${i % 8}` }), one.name)),
  );
}

/**
 * A chart: `{kind: "bar"|"line", labels: [str], series: [{name, values: [number]}],
 * stacked?, format?}`. Returns a `div.chart`.
 */
export function chart({ kind = "bar", labels = [], series = [], stacked = false, format = String, title }) {
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title || "chart" });
  const plotW = W - PAD.left - PAD.right;
  const plotH = H - PAD.top - PAD.bottom;
  const value = (v) => (typeof v === "number" && isFinite(v) ? v : 0);
  let max = 0;
  labels.forEach((_, i) => {
    if (stacked && kind === "bar") max = Math.max(max, series.reduce((sum, one) => sum + value(one.values[i]), 0));
    else series.forEach((one) => (max = Math.max(max, value(one.values[i]))));
  });
  max = niceMax(max);
  axes(svg, labels, max, format);
  const y = (v) => PAD.top + plotH - (plotH * value(v)) / max;
  const slot = plotW / Math.max(1, labels.length);
  if (kind === "line") {
    series.forEach((one, n) => {
      const points = labels.map((_, i) => `${PAD.left + slot * (i + 0.5)},${y(one.values[i])}`);
      svg.append(s("path", { class: `line series-${n % 8}`, d: "M" + points.join("L"), fill: "none" }));
      labels.forEach((label, i) => {
        const dot = s("circle", { class: `series-${n % 8}`, cx: PAD.left + slot * (i + 0.5), cy: y(one.values[i]), r: 3 });
        dot.append(s("title", {}, `${one.name} · ${label}: ${format(value(one.values[i]))}`));
        svg.append(dot);
      });
    });
  } else {
    const groups = stacked ? 1 : Math.max(1, series.length);
    const barW = Math.max(2, (slot * 0.8) / groups);
    labels.forEach((label, i) => {
      let base = 0;
      series.forEach((one, n) => {
        const v = value(one.values[i]);
        const x = PAD.left + slot * i + slot * 0.1 + (stacked ? 0 : n * barW);
        const top = stacked ? y(base + v) : y(v);
        const bottom = stacked ? y(base) : y(0);
        const bar = s("rect", { class: `series-${n % 8}`, x, y: top, width: barW, height: Math.max(0, bottom - top) });
        bar.append(s("title", {}, `${one.name} · ${label}: ${format(v)}`));
        svg.append(bar);
        base += v;
      });
    });
  }
  return h("div", { class: "chart" }, title ? h("h2", {}, title) : null, svg, legend(series));
}
