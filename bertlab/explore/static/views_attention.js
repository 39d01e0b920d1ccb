/* bertlab explore: attention. "attention": one head's weights as lines between the tokens (a
 * virtualised SVG: only the rows in sight are drawn) beside the grid of every layer × head; and
 * "worked": for the chosen head and pair (i, j), the arithmetic from q_i and k_j to the weight,
 *     a_ij = softmax_j(q_i · k_j / sqrt(D) + mask_j)          (Vaswani et al. 2017, eq. 1)
 * recomputed here and set beside the weight the model returned. Raw weights can mislead, so both
 * views also offer the norm-weighted contribution a_ij · ||f(x_j)|| (Kobayashi et al. 2020),
 * normalised per row so that it reads like a weight. */
"use strict";

(() => {
  const {el, svg, fmt} = BL;
  const MONO = 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", Menlo, monospace';
  const ROW = 18, TOP = 22, QX = 170, KX = 330, HEAD_W = 500;
  const MANY = 48; // above this many tokens the head view draws one row at a time
  let mode = "weight"; // or "norm": a_ij * ||f(x_j)||, normalised per row

  const P = () => BL.payload;
  const dims = () => { const m = P().model; return {L: m.layers, A: m.heads, T: P().tokens.length, D: m.head_dim}; };
  const topk = () => !P().layers.attention.dtype;

  // The row of query i as [[j, value], ...] in the current mode (norm: a_ij ||f(x_j)||, rescaled
  // to sum to 1 over the stored j).
  function rowOf(l, h, i) {
    const r = BL.attentionRow(l, h, i);
    if (mode !== "norm") return r;
    const vn = BL.row(P().layers.value_norm, l, h);
    const out = r.map(([j, w]) => [j, w * vn[j]]);
    const s = out.reduce((a, [, v]) => a + v, 0) || 1;
    return out.map(([j, v]) => [j, v / s]);
  }
  function defaultPair() {
    const {T} = dims(), s = BL.state;
    if (s.pair) return s.pair;
    const i = Math.min(1, T - 1), r = BL.attentionRow(s.layer, s.head, i);
    let best = r[0];
    for (const e of r) if (e[1] > best[1]) best = e;
    return [i, best ? best[0] : 0];
  }

  // ============================================================ head view (virtualised)

  // Draws rows [from, to) of the head view into the groups of one SVG (text and lines).
  // Which lines: those of the focused token (as query, or as key when pointed at on the right),
  // else (the overview) those of every query row in [from, to); always the selected pair's line.
  // Returns what it drew: "every row", "row i", "key i" or "pair row" (a long input's overview).
  function drawLinks(g, from, to, side) {
    const {T} = dims(), {layer: l, head: h, token} = BL.state, pair = defaultPair();
    g.textContent = "";
    const line = (i, j, v, rel, sel) => g.appendChild(svg("line", {
      class: "link" + (sel ? " sel" : ""), "data-i": i, "data-j": j,
      x1: QX + 6, y1: TOP + i * ROW + ROW / 2 - 4, x2: KX - 6, y2: TOP + j * ROW + ROW / 2 - 4,
      stroke: sel ? "#d35400" : "#1f5fa8", "stroke-opacity": sel ? 1 : Math.max(0.04, rel),
      "stroke-width": (sel ? 1.5 : 0.5) + 3 * rel, "data-w": v}));
    const rowLines = i => {
      const r = rowOf(l, h, i), m = r.reduce((a, [, v]) => Math.max(a, v), 1e-12);
      for (const [j, v] of r) if (v / m >= 0.02 && !(i === pair[0] && j === pair[1])) line(i, j, v, v / m);
    };
    if (token != null && side === "k") { // every query's line into key `token`
      const vals = [];
      for (let i = 0; i < T; i++) {
        const v = rowOf(l, h, i).find(e => e[0] === token);
        if (v) vals.push([i, v[1]]);
      }
      const m = vals.reduce((a, [, v]) => Math.max(a, v), 1e-12);
      for (const [i, v] of vals) line(i, token, v, v / m);
    } else if (token != null) rowLines(token);
    else if (T > MANY) rowLines(pair[0]); // a long input: every row at once is a blur
    else for (let i = from; i < to; i++) rowLines(i);
    const pv = rowOf(l, h, pair[0]).find(e => e[0] === pair[1]);
    line(pair[0], pair[1], pv ? pv[1] : 0, 1, true);
    if (token != null) return `${side === "k" ? "key" : "row"} ${token}`;
    return T > MANY ? "pair row" : "every row";
  }

  function drawTokens(g, from, to) {
    g.textContent = "";
    const pair = defaultPair();
    for (let i = from; i < to; i++) {
      const y = TOP + i * ROW + ROW / 2;
      const lab = BL.clip(BL.tokenLabel(i), 18);
      const cls = k => "tok" + (BL.state.token === i ? " hl" : "") + ((k === "q" ? pair[0] : pair[1]) === i ? " sel" : "");
      g.append(
        svg("text", {class: cls("q"), "data-i": i, "data-side": "q", x: QX, y, "text-anchor": "end",
          "font-family": MONO, "font-size": 12, fill: "#1d2330"}, lab),
        svg("text", {class: cls("k"), "data-i": i, "data-side": "k", x: KX, y, "text-anchor": "start",
          "font-family": MONO, "font-size": 12, fill: "#1d2330"}, lab));
    }
  }

  function headView(box) {
    const {T} = dims();
    const s = svg("svg", {id: "head-view", width: HEAD_W, height: TOP + T * ROW + 6});
    const gl = svg("g", {class: "links"}), gt = svg("g", {class: "texts"});
    s.append(
      svg("text", {x: QX, y: 13, "text-anchor": "end", "font-family": MONO, "font-size": 11, fill: "#5c6577"}, "query i"),
      svg("text", {x: KX, y: 13, "font-family": MONO, "font-size": 11, fill: "#5c6577"}, "key j"), gl, gt);
    const scroller = el("div", {class: "head-scroll"}, s);
    box.appendChild(scroller);
    let side = "q", range = [-1, -1], top = 0, hgt = 560;
    // The rows in sight. scrollTop and clientHeight are read only when scrolling: reading them
    // after another view changed the DOM would force a layout of the whole page on every hover.
    const measure = () => { top = scroller.scrollTop; hgt = scroller.clientHeight || 560; };
    const visible = () =>
      [Math.max(0, Math.floor((top - TOP) / ROW) - 4), Math.min(T, Math.ceil((top + hgt) / ROW) + 4)];
    const redraw = (texts) => {
      const [a, b] = visible();
      if (texts || a !== range[0] || b !== range[1]) { drawTokens(gt, a, b); range = [a, b]; }
      s.dataset.shown = drawLinks(gl, a, b, side);
    };
    let queued = false;
    scroller.addEventListener("scroll", () => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => { queued = false; measure(); redraw(false); });
    });
    // Clicks: a query token fixes i, then a key token (or a line) fixes j.
    s.addEventListener("mouseover", ev => { const t = ev.target.closest("text.tok"); if (t) side = t.dataset.side; });
    // out of the view, a token is a query again (unless one pinned here as a key is still shown)
    s.addEventListener("mouseleave", () => { if (!BL.pinned()) side = "q"; });
    s.addEventListener("click", ev => {
      const t = ev.target.closest("text.tok"), ln = ev.target.closest(".link");
      const [pi, pj] = defaultPair();
      if (t && t.dataset.side === "q") BL.set({pair: [Number(t.dataset.i), pj]});
      else if (t) BL.set({pair: [pi, Number(t.dataset.i)]});
      else if (ln) BL.set({pair: [Number(ln.dataset.i), Number(ln.dataset.j)]});
    });
    // Export: the rows in sight, drawn into a fresh SVG shifted to the top.
    const exportFigure = () => {
      const [a, b] = visible(), out = svg("svg", {width: HEAD_W, height: TOP + (b - a) * ROW + 6});
      const g = svg("g", {transform: `translate(0, ${-a * ROW})`}), g1 = svg("g"), g2 = svg("g");
      drawLinks(g1, a, b, side); drawTokens(g2, a, b);
      g.append(g1, g2);
      out.append(svg("text", {x: QX, y: 13, "text-anchor": "end", "font-family": MONO, "font-size": 11,
        fill: "#5c6577"}, "query i"), svg("text", {x: KX, y: 13, "font-family": MONO, "font-size": 11,
        fill: "#5c6577"}, "key j"), g);
      return out;
    };
    redraw(true);
    requestAnimationFrame(() => { measure(); redraw(true); });
    return {redraw, exportFigure};
  }

  // ============================================================ grid of every layer x head

  // Thumbnails are drawn at GAMMA: a head's weights mostly lie far below its largest, and on a
  // linear scale every thumbnail is a pale wash with one dark cell; v^0.5 lifts the weights of a
  // tenth of the largest to a third of the colour scale, so a column (attention to [CLS] or [SEP])
  // and a diagonal (attention to the neighbours) both stand out, each thumbnail scaled to its own
  // largest value.
  const GAMMA = 0.5, THUMB_MAX = 84;

  // One thumbnail: the T x T map shrunk to at most S x S pixels, each pixel the largest value of
  // its block (so a peak never disappears), each token `cell` pixels when T is small.
  function thumb(l, h, S) {
    const {T} = dims(), n = Math.min(S, T), cell = Math.max(1, Math.floor(S / T)), size = n * cell;
    const acc = new Float32Array(n * n);
    for (let i = 0; i < T; i++) {
      const r = Math.floor(i * n / T);
      for (const [j, v] of rowOf(l, h, i)) {
        const c = Math.floor(j * n / T), k = r * n + c;
        if (v > acc[k]) acc[k] = v;
      }
    }
    let m = 1e-12;
    for (let k = 0; k < acc.length; k++) m = Math.max(m, acc[k]);
    const cv = BL.heatCanvas(n, n, (r, c) => (acc[r * n + c] / m) ** GAMMA, {lo: 0, hi: 1, cell, cls: "cell"});
    cv.style.width = cv.style.height = size + 2 + "px"; // and its border: the pixels are not rescaled
    return cv;
  }

  // What a head does, in words, for its thumbnail's title: the shares of its weight on the special
  // tokens ([CLS], [SEP]), on the token itself and its neighbours (|i - j| <= 1), and elsewhere.
  function headSummary(l, h) {
    const {T} = dims(), special = BL.payload.tokens.map(t => t.special);
    let sp = 0, near = 0, all = 0;
    for (let i = 0; i < T; i++) {
      for (const [j, v] of BL.attentionRow(l, h, i)) {
        all += v;
        if (special[j]) sp += v; else if (Math.abs(i - j) <= 1) near += v;
      }
    }
    const pc = x => `${Math.round(100 * x / (all || 1))}%`;
    return `${pc(sp)} on [CLS]/[SEP], ${pc(near)} on itself and its neighbours, ${pc(all - sp - near)} elsewhere`;
  }

  function grid(box) {
    const {L, A} = dims(), avail = (box.clientWidth || 900) - 34;
    const S = Math.max(24, Math.min(THUMB_MAX, Math.floor(avail / A) - 5));
    const g = el("div", {id: "attention-grid", style: {gridTemplateColumns: `28px repeat(${A}, auto)`}});
    const thumbs = [];
    g.appendChild(el("span", {class: "glabel"}, ""));
    for (let h = 0; h < A; h++) g.appendChild(el("span", {class: "glabel"}, "h" + h));
    for (let l = 0; l < L; l++) {
      g.appendChild(el("span", {class: "glabel"}, "L" + l));
      for (let h = 0; h < A; h++) {
        const cv = thumb(l, h, S);
        cv.dataset.layer = l; cv.dataset.head = h;
        cv.title = `layer ${l}, head ${h}: ${headSummary(l, h)}`;
        cv.addEventListener("click", () => BL.set({layer: l, head: h}));
        g.appendChild(cv);
        thumbs.push(cv);
      }
    }
    box.appendChild(g);
    const mark = () => {
      for (const c of thumbs) {
        c.classList.toggle("sel", Number(c.dataset.layer) === BL.state.layer && Number(c.dataset.head) === BL.state.head);
      }
    };
    mark();
    // Export: every thumbnail into one canvas with layer and head labels.
    const exportFigure = () => {
      const pad = 30, gap = 4, w = thumbs[0].width;
      const cv = el("canvas", {width: pad + A * (w + gap), height: pad + L * (w + gap)}), ctx = cv.getContext("2d");
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, cv.width, cv.height);
      ctx.fillStyle = "#5c6577"; ctx.font = `10px ${MONO}`;
      for (let h = 0; h < A; h++) ctx.fillText("h" + h, pad + h * (w + gap), 12);
      thumbs.forEach(t => {
        const l = Number(t.dataset.layer), h = Number(t.dataset.head);
        if (h === 0) ctx.fillText("L" + l, 2, pad + l * (w + gap) + w / 2);
        ctx.drawImage(t, pad + h * (w + gap), pad - 10 + l * (w + gap));
        if (l === BL.state.layer && h === BL.state.head) {
          ctx.strokeStyle = "#d35400"; ctx.strokeRect(pad + h * (w + gap) - 1, pad - 11 + l * (w + gap), w + 2, w + 2);
        }
      });
      return cv;
    };
    return {mark, exportFigure};
  }

  // ============================================================ the attention view

  const attentionView = {id: "attention", title: "Attention: every layer and head", order: 30, figure: () => []};
  attentionView.render = (box, payload) => {
    const {L, A, T} = dims();
    const opts = (n, name) => Array.from({length: n}, (_, k) => el("option", {value: k}, `${name} ${k}`));
    const ls = el("select", {id: "layer-select", "aria-label": "layer"}, opts(L, "layer"));
    const hs = el("select", {id: "head-select", "aria-label": "head"}, opts(A, "head"));
    ls.addEventListener("change", () => BL.set({layer: Number(ls.value)}));
    hs.addEventListener("change", () => BL.set({head: Number(hs.value)}));
    const bw = el("button", {type: "button", class: "on", "data-mode": "weight"}, "weight a_ij");
    const bn = el("button", {type: "button", "data-mode": "norm"}, "contribution a_ij·‖f(x_j)‖");
    const left = el("div", {class: "col", style: {width: HEAD_W + 2 + "px"}});
    const side = el("div", {class: "col", style: {flex: "1 1 300px"}});
    const right = el("div", {class: "col", style: {flex: "1 1 100%"}}); // the grid: a row of its own
    const kNote = topk() ? ` Summarised: each row keeps its ${payload.layers.attention.topk} largest ` +
      "weights; the rest of the row is not drawn." : "";
    box.append(
      el("div", {class: "controls"}, ls, hs, el("span", {class: "toggle", id: "attention-mode"}, bw, bn)),
      el("div", {class: "row"}, left, side, right));
    side.append(el("p", {class: "note"}, "Lines: how much query i (left) takes from key j (right); " +
      "opacity and width are relative to the row's largest. " +
      (T > MANY ? "With this many tokens one row is drawn at a time (the selected pair's query). "
        : "With the pointer away from the tokens, every row is drawn. ") +
      "Point at a token, here or in any view, to see its row alone (or, on the right, the lines into " +
      "it); click it to keep it (click again to let go). Click a query then a key (or a line) to work " +
      "that pair out below." + kNote));
    right.append(el("p", {class: "note"}, `All ${L} × ${A} heads (rows: layers, columns: heads), each ` +
      `a ${T} × ${T} map: row = query i, column = key j, darker = larger. Each thumbnail is scaled to its ` +
      "own largest weight and drawn at a square root (gamma 0.5), so that weaker structure shows: a dark " +
      "column is a head that looks at one token from everywhere (often [CLS] or [SEP]), a diagonal one " +
      "that looks at itself or its neighbours. Point at one for its shares; click it to show it."));
    let hv = headView(left), gr = grid(right);
    const setMode = m => {
      mode = m;
      bw.classList.toggle("on", m === "weight"); bn.classList.toggle("on", m === "norm");
      right.removeChild(right.lastChild);
      gr = grid(right);
      hv.redraw(false);
    };
    bw.addEventListener("click", () => setMode("weight"));
    bn.addEventListener("click", () => setMode("norm"));
    BL.on((s, ch) => {
      ls.value = String(s.layer); hs.value = String(s.head);
      if (ch.includes("layer") || ch.includes("head")) gr.mark();
      hv.redraw(ch.includes("pair"));
    });
    attentionView.figure = () => [hv.exportFigure(), gr.exportFigure()];
  };
  BL.view(attentionView);

  // ============================================================ the worked example

  // Everything from q_i and k_j to a_ij, in float64.
  function work(l, h, i, j) {
    const {T, D} = dims(), Ly = P().layers, scale = Ly.scale;
    const qRow = BL.row(Ly.query, l, i), q = qRow.subarray(h * D, (h + 1) * D);
    const kOf = t => BL.row(Ly.key, l, t).subarray(h * D, (h + 1) * D);
    const mask = BL.arr(Ly.mask).data;
    const dot = (a, b) => { let s = 0; for (let d = 0; d < D; d++) s += a[d] * b[d]; return s; };
    const scores = new Float64Array(T);
    for (let t = 0; t < T; t++) scores[t] = dot(q, kOf(t)) * scale + mask[t];
    let max = -Infinity;
    for (let t = 0; t < T; t++) max = Math.max(max, scores[t]);
    let sum = 0;
    for (let t = 0; t < T; t++) sum += Math.exp(scores[t] - max); // subtracting the max: same softmax, no overflow
    const qk = dot(q, kOf(j)), weight = Math.exp(scores[j] - max) / sum;
    const vn = BL.row(Ly.value_norm, l, h);
    let contribSum = 0;
    for (const [t, w] of BL.attentionRow(l, h, i)) contribSum += w * vn[t];
    return {q, k: kOf(j), qk, scale, mask: mask[j], score: scores[j], scores, max, sum, weight,
      stored: BL.attention(l, h, i, j), vn: vn[j], contribSum};
  }

  // The row s_i,· as bars, each labelled with its key token (a .tok, so pointing at it links it).
  // Labels lie flat when the row can be widened (to FLAT_MAX pixels) until they fit under their bars,
  // else upright; then every bar is at least BAR_MIN pixels wide, and a long row scrolls sideways
  // rather than dropping labels.
  const BAR_MIN = 13, LABEL_CHARS = 12, FLAT_MAX = 800;
  function bars(scores, j) {
    const T = scores.length, labels = Array.from({length: T}, (_, t) => BL.clip(BL.tokenLabel(t), LABEL_CHARS));
    const widest = Math.max(...labels.map(s => BL.textWidth(s, 10)));
    const flat = T * (widest + 4) <= FLAT_MAX;
    const bw = flat ? Math.max(600 / T, widest + 4) : Math.max(600 / T, BAR_MIN), W = T * bw;
    const Hh = 80, labH = flat ? 16 : widest + 8;
    let lo = Infinity, hi = -Infinity;
    for (const v of scores) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    lo = Math.min(lo, 0); hi = Math.max(hi, 0);
    const y = v => 6 + (hi - v) / ((hi - lo) || 1) * (Hh - 12);
    const g = svg("svg", {class: "bars", width: W + 60, height: Hh + labH + 16});
    g.appendChild(svg("line", {x1: 0, x2: W, y1: y(0), y2: y(0), stroke: "#d9dde5"}));
    scores.forEach((v, t) => g.appendChild(svg("rect", {class: "bar" + (t === j ? " sel" : ""), "data-i": t,
      x: t * bw, width: Math.max(0.8, bw - (bw > 3 ? 1 : 0)), y: Math.min(y(v), y(0)),
      height: Math.max(0.5, Math.abs(y(v) - y(0))), fill: t === j ? "#d35400" : "#9ecae1"},
    svg("title", null, `key ${t} "${BL.tokenLabel(t)}": s = ${fmt(v, 4)}`))));
    const txt = (x, yy, s) => g.appendChild(svg("text", {x, y: yy, "font-family": MONO, "font-size": 10, fill: "#5c6577"}, s));
    txt(W + 4, y(hi) + 4, fmt(hi, 2)); txt(W + 4, y(lo), fmt(lo, 2));
    labels.forEach((s, t) => {
      const x = t * bw + bw / 2 - (bw > 3 ? 0.5 : 0), sel = t === j;
      const a = {class: "tok bar-label" + (sel ? " sel" : ""), "data-i": t, "font-family": MONO, "font-size": 10,
        fill: sel ? "#d35400" : "#1d2330", "font-weight": sel ? 700 : 400};
      g.appendChild(flat
        ? svg("text", {...a, x, y: Hh + 10, "text-anchor": "middle"}, s)
        : svg("text", {...a, x: 0, y: 0, "text-anchor": "end", "dominant-baseline": "central",
          transform: `translate(${x.toFixed(1)},${Hh + 4}) rotate(-90)`}, s));
    });
    txt(0, Hh + labH + 12, `key j (the orange bar: j = ${j})`);
    return g;
  }

  const workedView = {id: "worked", title: "Worked example: from q and k to one attention weight", order: 35,
    figure: () => []};
  workedView.render = box => {
    const {T} = dims();
    const tokOpts = () => BL.payload.tokens.map(t => el("option", {value: t.i}, `${t.i} ${t.token}`));
    const si = el("select", {id: "pair-i", "aria-label": "query token"}, tokOpts());
    const sj = el("select", {id: "pair-j", "aria-label": "key token"}, tokOpts());
    si.addEventListener("change", () => BL.set({pair: [Number(si.value), defaultPair()[1]]}));
    sj.addEventListener("change", () => BL.set({pair: [defaultPair()[0], Number(sj.value)]}));
    const out = el("div", {id: "worked"});
    box.append(el("div", {class: "controls"}, el("label", null, "query i ", si), el("label", null, "key j ", sj),
      el("span", {class: "note"}, "(layer and head: the selects above, or a grid cell)")), out);
    let figs = [];
    const draw = () => {
      const {layer: l, head: h} = BL.state, [i, j] = defaultPair();
      si.value = String(i); sj.value = String(j);
      const w = work(l, h, i, j), D = w.q.length;
      Object.assign(out.dataset, {layer: l, head: h, i, j});
      out.textContent = "";
      const line = (label, ...rest) => el("tr", null, el("th", null, label), el("td", {class: "mono"}, ...rest));
      const vec = v => el("span", {class: "vals"}, Array.from(v, x => fmt(x, 4)).join("  "));
      const tk = t => el("span", {class: "tok mono", "data-i": t}, `"${BL.tokenLabel(t)}"`);
      const diff = w.stored == null ? null : Math.abs(w.weight - w.stored);
      const half = P().layers.query.dtype === "f16";
      const share = w.stored == null ? null : w.stored * w.vn / w.contribSum;
      const chart = bars(w.scores, j);
      out.append(
        el("p", null, `Layer ${l}, head ${h}: query token ${i} `, tk(i), ` attends to key token ${j} `, tk(j),
          ` (${D} dimensions per head, T = ${T}).`),
        el("table", null,
          line(`q_${i} (query, head slice)`, vec(w.q)),
          line(`k_${j} (key, head slice)`, vec(w.k)),
          line("q · k", `Σ_d q_d k_d = ${fmt(w.qk, 6)}`),
          line("× scale", `${fmt(w.qk, 6)} × 1/√${D} (${fmt(w.scale, 6)}) = ${fmt(w.qk * w.scale, 6)}`),
          line(`+ mask[${j}]`, `${fmt(w.qk * w.scale, 6)} + ${fmt(w.mask, 4)} = s_${i},${j} = ${fmt(w.score, 6)}`),
          line(`the row s_${i},·`, el("div", {class: "bars-scroll"}, chart)),
          line("max over the row", `m = ${fmt(w.max, 6)}`),
          line("sum of exp", `Σ_t exp(s_${i},t − m) = ${fmt(w.sum, 6)}`),
          line("softmax", `exp(${fmt(w.score, 6)} − ${fmt(w.max, 6)}) / ${fmt(w.sum, 6)} = `,
            el("span", {id: "worked-recomputed", class: "big"}, w.weight.toFixed(8)), "  (this page)"),
          line("the model's weight", el("span", {id: "worked-weight", class: "big"},
            w.stored == null ? "not stored" : w.stored.toFixed(8)),
          w.stored == null ? "  (outside this row's stored top-k)" : el("span", {class: diff < (half ? 1e-2 : 1e-5) ? "ok" : "bad"},
            `  difference ${fmt(diff, 2)}` + (half ? " (queries and keys stored in float16)" : ""))),
          line("contribution", `a_ij × ‖f(x_${j})‖ = ${w.stored == null ? "–" : fmt(w.stored, 6)} × ` +
            `${fmt(w.vn, 4)} = ${w.stored == null ? "–" : fmt(w.stored * w.vn, 6)}` +
            (share == null ? "" : `, ${fmt(100 * share, 2)}% of row ${i}'s total (weight: ${fmt(100 * w.stored, 2)}%)`))),
        el("p", {class: "note"}, "a_ij = softmax_j(q_i·k_j/√D + mask_j): Vaswani et al. 2017, eq. 1. " +
          "‖f(x_j)‖ is the length of what token j's value vector adds to the output through this head " +
          "(v_j W_O); weight × length is the contribution Kobayashi et al. 2020 argue to look at."));
      figs = [workedFigure(l, h, i, j, w), chart];
    };
    draw();
    BL.on((s, ch) => { if (ch.some(k => k === "layer" || k === "head" || k === "pair")) draw(); });
    workedView.figure = () => figs;
  };

  // The exported worked example: the same lines as SVG text.
  function workedFigure(l, h, i, j, w) {
    const D = w.q.length, lines = [
      `layer ${l}, head ${h}: query ${i} "${BL.tokenLabel(i)}" → key ${j} "${BL.tokenLabel(j)}"`,
      `q_${i} = [${Array.from(w.q.subarray(0, 8), x => fmt(x, 4)).join(", ")}${D > 8 ? ", …" : ""}]`,
      `k_${j} = [${Array.from(w.k.subarray(0, 8), x => fmt(x, 4)).join(", ")}${D > 8 ? ", …" : ""}]`,
      `q·k = ${fmt(w.qk, 6)};  × 1/√${D} = ${fmt(w.qk * w.scale, 6)};  + mask ${fmt(w.mask, 4)} = ${fmt(w.score, 6)}`,
      `row max ${fmt(w.max, 6)};  Σ exp(s − max) = ${fmt(w.sum, 6)}`,
      `softmax = ${w.weight.toFixed(8)} (page)   model: ${w.stored == null ? "not stored" : w.stored.toFixed(8)}`,
      `contribution a·‖f(x_j)‖ = ${w.stored == null ? "–" : fmt(w.stored * w.vn, 6)}`];
    const s = svg("svg", {width: 660, height: lines.length * 18 + 6});
    lines.forEach((t, k) => s.appendChild(svg("text", {x: 0, y: 15 + k * 18, "font-family": MONO,
      "font-size": 12, fill: "#1d2330"}, t)));
    return s;
  }
  BL.view(workedView);
})();
