/* bertlab explore: the input side. "tokens": the text cut into word pieces; "embeddings": how
 * one token's input vector is built (word + position + segment, then LayerNorm, as reference 002
 * does by hand) and the position tables (reference 001: why BERT learns its positions). */
"use strict";

(() => {
  const {el, svg, fmt, chars, MONO} = BL;
  const SEG = ["A", "B"];
  const measure = BL.textWidth; // width of a string in the page's monospace font (SVG layout)

  // The focused token: the one under the pointer (or pinned), else the first word piece.
  const focusToken = () => BL.state.token ?? (BL.payload.tokens.length > 1 ? 1 : 0);

  // ============================================================ tokens

  // Every text is cut as an array of code points (the unit of the payload's offsets; see core).
  const split = new WeakMap(); // payload -> {text, pair} as code points, split once
  function codePoints(P, seg) {
    if (!split.has(P)) split.set(P, {text: chars(P.text), pair: P.pair == null ? null : chars(P.pair)});
    return split.get(P)[seg === 1 ? "pair" : "text"];
  }
  const cut = (cp, a, b) => cp.slice(a, b).join("");

  function charsOf(t) {
    if (t.start == null) return null;
    const cp = codePoints(BL.payload, t.segment);
    return cp == null ? null : cut(cp, t.start, t.end);
  }

  // The characters the model read of each segment, as code points: after truncation, the text up
  // to the last kept piece (the rest is counted, not shown).
  function segments(P) {
    const segs = P.pair != null ? [0, 1] : [0];
    return segs.map(seg => {
      const cp = codePoints(P, seg);
      if (!P.truncated) return {cp, cut: 0};
      const ends = P.tokens.filter(t => t.segment === seg && t.end != null).map(t => t.end);
      const end = ends.length ? Math.max(...ends) : 0;
      return {cp: cp.slice(0, end), cut: cp.length - end};
    });
  }

  // One line per segment: the text, each token's characters in a span (class "tok") so that
  // hovering a chip highlights them, and hovering them highlights the chip.
  function textLines(P) {
    return segments(P).map(({cp, cut: left}, seg) => {
      const line = el("div", {class: "text-line"}, el("span", {class: "seg-label"}, SEG[seg]));
      const spans = P.tokens.filter(t => t.segment === seg && t.start != null && t.end != null)
        .sort((a, b) => a.start - b.start);
      let pos = 0;
      for (const t of spans) {
        if (t.start < pos) continue; // overlapping offsets: keep the first
        if (t.start > pos) line.appendChild(document.createTextNode(cut(cp, pos, t.start)));
        line.appendChild(el("span", {class: "ch tok", "data-i": t.i}, cut(cp, t.start, t.end)));
        pos = t.end;
      }
      if (pos < cp.length) line.appendChild(document.createTextNode(cut(cp, pos)));
      if (left) line.appendChild(el("span", {class: "muted"}, ` … and ${left} more characters, cut off (truncated)`));
      return line;
    });
  }

  // A special token has no characters, but it has a segment: [CLS] and the first [SEP] are A's,
  // the [SEP] that ends a pair is B's (the token type ids the model reads).
  function chip(t) {
    const span = t.start == null ? `${SEG[t.segment]} · special` : `${SEG[t.segment]} ${t.start}–${t.end}`;
    const cls = ["chip", "tok", "seg" + t.segment, t.special ? "special" : "", t.masked ? "masked" : ""];
    return el("div", {class: cls.filter(Boolean).join(" "), "data-i": t.i, "data-segment": SEG[t.segment],
      title: `token ${t.i}: id ${t.id}, segment ${SEG[t.segment]}` +
        (t.start == null ? "" : `, characters ${t.start}–${t.end}`)},
    el("span", {class: "piece"}, t.token),
    el("span", {class: "meta"}, `${t.i} · ${t.id}`),
    el("span", {class: "meta seg"}, span));
  }

  function tokenDetail(P) {
    const i = focusToken(), t = P.tokens[i];
    if (!t) return "";
    const parts = [`token ${i} "${t.token}": id ${t.id}, segment ${SEG[t.segment]}`];
    if (t.special) parts.push("a special token added by the tokenizer (it has no characters in the text)");
    else {
      parts.push(`characters ${t.start}–${t.end} of ${t.segment ? "the pair" : "the text"}: "${charsOf(t)}"`);
      const same = P.tokens.filter(u => u.word === t.word && u.segment === t.segment);
      if (same.length > 1) parts.push(`one of ${same.length} pieces of the word ` +
        `"${same.map(u => u.token.replace(/^##/, "")).join("")}"`);
    }
    if (t.masked) parts.push("masked: the model predicts it");
    return parts.join("; ") + ".";
  }

  function renderTokens(box, P) {
    const nSpecial = P.tokens.filter(t => t.special).length;
    const words = new Set(P.tokens.filter(t => t.word != null).map(t => `${t.segment}:${t.word}`)).size;
    const detail = el("p", {class: "note", id: "token-detail"}, tokenDetail(P));
    box.append(
      el("div", {class: "text-shown"}, textLines(P)),
      el("p", {class: "note"}, `${P.tokens.length} word pieces (${words} words, ${nSpecial} special tokens). ` +
        "Each chip: the piece, its position · vocabulary id, and its segment and characters in the text " +
        "(characters counted as code points). " +
        '"##" marks a piece that continues a word. Blue: segment A, orange: segment B; a special token ' +
        "is grey, with its segment's colour along its bottom edge."),
      el("div", {class: "chips", id: "token-chips"}, P.tokens.map(chip)),
      detail);
    BL.on((s, ch) => { if (ch.includes("token")) detail.textContent = tokenDetail(P); });
  }

  // The exported picture of the tokens view: the text and the chips, drawn in SVG.
  const SEG_FILL = ["#e7f0fb", "#fbefe2"], SEG_EDGE = ["#6b9bd1", "#e39a52"];
  function tokensFigure() {
    const P = BL.payload, W = 1000, out = svg("svg", {width: W, height: 10});
    let y = 18;
    segments(P).forEach(({cp, cut: left}, seg) => {
      if (cp.length > 1300) { left += cp.length - 1300; cp = cp.slice(0, 1300); }
      const tail = left ? ` … (${left} more characters)` : "";
      for (let k = 0; k < cp.length || k === 0; k += 130) {
        out.appendChild(svg("text", {x: 0, y, "font-family": MONO, "font-size": 13, fill: "#1d2330"},
          (k ? "  " : SEG[seg] + " ") + cut(cp, k, k + 130) + (k + 130 >= cp.length ? tail : "")));
        y += 18;
      }
    });
    let x = 0, right = 0;
    y += 8;
    for (const t of P.tokens) {
      const meta = `${t.i} · ${t.id}` + (t.special ? ` · ${SEG[t.segment]}` : "");
      const w = Math.max(measure(t.token, 13), measure(meta, 10)) + 12;
      if (x + w > W) { x = 0; y += 42; }
      out.append(
        svg("rect", {x, y, width: w, height: 36, rx: 3, fill: t.special ? "#eceff3" : SEG_FILL[t.segment],
          stroke: "#d9dde5"}),
        t.special ? svg("rect", {x: x + 1, y: y + 33, width: w - 2, height: 3, fill: SEG_EDGE[t.segment]}) : null,
        svg("text", {x: x + w / 2, y: y + 15, "text-anchor": "middle", "font-family": MONO, "font-size": 13,
          "font-weight": t.special ? 700 : 400, fill: t.masked ? "#a01919" : "#1d2330"}, t.token),
        svg("text", {x: x + w / 2, y: y + 30, "text-anchor": "middle", "font-family": MONO, "font-size": 10,
          fill: "#5c6577"}, meta));
      x += w + 6;
      right = Math.max(right, x);
    }
    const textW = Math.max(...Array.from(out.querySelectorAll("text"), t => measure(t.textContent, 13)));
    out.setAttribute("width", Math.ceil(Math.min(W, Math.max(right, textW + 4))));
    out.setAttribute("height", y + 42);
    return out;
  }

  BL.view({id: "tokens", title: "Tokens: the text → word pieces", order: 10, render: renderTokens,
    figure: tokensFigure});

  // ============================================================ embeddings

  const F64 = a => Float64Array.from(a);
  // The colour scale of a group of vectors: the 98th percentile of |x|, so that the few outlier
  // dimensions BERT models have do not wash every other dimension out (they saturate instead).
  function scaleOf(...vs) {
    const a = Float64Array.from(vs.flatMap(v => Array.from(v, Math.abs))).sort();
    return Math.max(1e-12, a[Math.min(a.length - 1, Math.floor(0.98 * a.length))]);
  }
  const first = (v, n = 8) => "[" + Array.from(v.subarray(0, n), x => fmt(x, 4)).join(", ") +
    (v.length > n ? ", …]" : "]");

  // One SVG row: label, a diverging strip over the H dimensions, the first numbers.
  const LABEL_W = 200, STRIP_W = 288, ROW_H = 22;
  function vecRow(g, y, label, vec, scale, note, shade = vec) {
    g.appendChild(svg("text", {x: 0, y: y + 15, "font-size": 12, "font-family": MONO, fill: "#1d2330"}, label));
    // the strip is a small canvas's picture (one <image>, not H rects: cheap to redraw on hover)
    const cv = BL.strip(shade, scale, {width: STRIP_W, height: ROW_H - 6});
    g.appendChild(svg("image", {x: LABEL_W, y: y + 3, width: STRIP_W, height: ROW_H - 6,
      href: cv.toDataURL("image/png"), preserveAspectRatio: "none"}));
    g.appendChild(svg("rect", {x: LABEL_W, y: y + 3, width: STRIP_W, height: ROW_H - 6, fill: "none",
      stroke: "#d9dde5"}));
    g.appendChild(svg("text", {x: LABEL_W + STRIP_W + 10, y: y + 15, "font-size": 11, "font-family": MONO,
      fill: "#1d2330"}, first(vec) + (note ? "  " + note : "")));
    return y + ROW_H;
  }
  function textRow(g, y, s, opts = {}) {
    g.appendChild(svg("text", {x: opts.x || 0, y: y + 14, "font-size": opts.size || 12, "font-family": MONO,
      fill: opts.fill || "#1d2330", "font-weight": opts.bold ? 700 : 400}, s));
    return y + (opts.h || 19);
  }

  // The page's own LayerNorm over the stored sum, with the stored mean and variance:
  //   y = (x - mean) / sqrt(var + eps) * gamma + beta        (Ba et al. 2016; reference 002)
  function layerNorm(E, i) {
    const x = F64(BL.row(E.sum, i)), g = F64(BL.row(E.gamma)), b = F64(BL.row(E.beta));
    const mean = BL.at(E.mean, i), v = BL.at(E.var, i), eps = E.eps, H = x.length;
    const xhat = x.map(xk => (xk - mean) / Math.sqrt(v + eps));
    const y = xhat.map((xh, k) => xh * g[k] + b[k]);
    const out = BL.row(E.output, i);
    let maxDiff = 0;
    for (let k = 0; k < H; k++) maxDiff = Math.max(maxDiff, Math.abs(y[k] - out[k]));
    // the mean and biased variance recomputed here too, to check the stored ones
    const m2 = x.reduce((s, a) => s + a, 0) / H, v2 = x.reduce((s, a) => s + (a - m2) ** 2, 0) / H;
    return {x, g, b, mean, v, eps, xhat, y, out, maxDiff, m2, v2};
  }

  function decomposition(P, i) {
    const E = P.embeddings, t = P.tokens[i];
    const word = BL.row(E.word, i), pos = BL.row(E.position, i), seg = BL.row(E.segment, i);
    const ln = layerNorm(E, i);
    const s1 = scaleOf(word, pos, seg, ln.x), s2 = scaleOf(ln.xhat, ln.y, ln.out);
    const W = LABEL_W + STRIP_W + 10 + 560, g = svg("svg", {id: "embed-figure", width: W, height: 10});
    let y = 0;
    y = textRow(g, y, `token ${i} "${t.token}" (id ${t.id}, position ${i}, segment ${SEG[t.segment]}), ` +
      `H = ${ln.x.length} dimensions; colours ±${fmt(s1, 3)} (input), ±${fmt(s2, 3)} (normalised); larger saturate`,
    {bold: true, h: 24});
    y = vecRow(g, y, `word[${t.id}]`, word, s1);
    y = vecRow(g, y, `+ position[${i}]`, pos, s1);
    y = vecRow(g, y, `+ segment[${SEG[t.segment]}]`, seg, s1);
    y = vecRow(g, y, "= sum x", ln.x, s1);
    y += 6;
    y = textRow(g, y, "LayerNorm, written out (reference 002):", {bold: true});
    y = textRow(g, y, `mean μ = Σx/H = ${fmt(ln.mean, 6)}` + `   (recomputed here: ${fmt(ln.m2, 6)})`);
    y = textRow(g, y, `variance σ² = Σ(x − μ)²/H = ${fmt(ln.v, 6)}   (recomputed here: ${fmt(ln.v2, 6)})` +
      `   ε = ${ln.eps}`);
    y = vecRow(g, y, "x̂ = (x − μ)/√(σ² + ε)", F32(ln.xhat), s2);
    // γ sits around 1: its strip shows γ − 1 (red: scales a dimension up, blue: down)
    const gm1 = BL.row(E.gamma).map(v => v - 1);
    y = vecRow(g, y, "× γ", BL.row(E.gamma), scaleOf(gm1), "(colour: γ − 1)", gm1);
    y = vecRow(g, y, "+ β", BL.row(E.beta), scaleOf(BL.row(E.beta)));
    y = vecRow(g, y, "= y (this page)", F32(ln.y), s2);
    y = vecRow(g, y, "output (the model)", ln.out, s2);
    const d0 = `dimension 0: (${fmt(ln.x[0], 6)} − ${fmt(ln.mean, 6)}) / √(${fmt(ln.v, 6)} + ${ln.eps})` +
      ` × ${fmt(ln.g[0], 4)} + ${fmt(ln.b[0], 4)} = ${fmt(ln.y[0], 6)}   (model: ${fmt(ln.out[0], 6)})`;
    y = textRow(g, y + 4, d0);
    // float16 storage (long inputs) leaves about 1e-3 relative error in each stored number
    const half = [E.sum, E.output, E.mean].some(a => a.dtype === "f16");
    const ok = ln.maxDiff < (half ? 5e-2 : 1e-3);
    y = textRow(g, y, `max |y − output| over the ${ln.x.length} dimensions = ${fmt(ln.maxDiff, 3)}` +
      (ok ? "  ✓ the page's arithmetic reproduces the model" : "  ✗ does not match") +
      (half ? " (numbers stored in float16)" : ""),
    {fill: ok ? "#1c7a34" : "#a01919", bold: true});
    g.setAttribute("height", y + 4);
    g.dataset.maxDiff = ln.maxDiff;
    return g;
  }
  const F32 = a => Float32Array.from(a);

  // ---- positions: learned vs sinusoidal (reference 001) ----------------------------------------

  // One canvas: the two similarity matrices side by side, and under each its table (dimensions
  // 0..63 as rows, positions as columns), every axis titled and ticked. Every shown position is a
  // whole number of pixels (cell) in both pictures, and every dimension 2 or more: the pictures are
  // drawn at their own resolution and never rescaled, so no stripe of the table can alias into a
  // moiré. The focused token's position is framed in the matrices and marked over the tables.
  const drawn = new WeakMap(); // payload -> its position pictures (drawn once, marked per token)
  function positionsCanvas(P, marked) {
    const Pp = P.embeddings.positions;
    if (!Pp) return null;
    if (!drawn.has(P)) drawn.set(P, positionPanels(P));
    return markedPositions(P, drawn.get(P), marked);
  }

  // About n + 1 evenly spread indices of 0..count-1, the last one included.
  function ticksOf(count, n = 4) {
    const out = [];
    for (let j = 0; j < n; j++) out.push(Math.floor(j * count / n));
    out.push(count - 1);
    return [...new Set(out)].filter(k => k >= 0);
  }

  function positionPanels(P) {
    const Pp = P.embeddings.positions;
    const idx = BL.arr(Pp.index).data, M = idx.length;
    const cell = Math.max(1, Math.floor(256 / M)), S = cell * M;
    const simL = BL.arr(Pp.learned_similarity).data, simS = BL.arr(Pp.sinusoid_similarity).data;
    let lo = 0;
    for (let k = 0; k < simL.length; k++) lo = Math.min(lo, simL[k], simS[k]);
    lo = Math.floor(lo * 10) / 10;
    const heat = d => BL.heatCanvas(M, M, (r, c) => d[r * M + c], {lo, hi: 1, cell});
    // the tables: every one of their first positions, over dimensions spread evenly over H
    // (payload.py), so that the sinusoids' short waves do not beat and their long waves show
    const rows = BL.arr(Pp.table_index).data, Mt = rows.length, tcell = Math.max(1, Math.floor(S / Mt));
    const dims = BL.arr(Pp.dims).data, nD = dims.length, dh = Math.max(2, Math.floor(128 / nD));
    const tab = a => { // transposed: row = dimension, column = position; colours as the strips'
      const d = BL.arr(a).data, m = scaleOf(d);
      const cv = BL.heatCanvas(nD, Mt, (r, c) => d[c * nD + r],
        {cw: tcell, ch: dh, rgb: v => BL.divergingRGB(v, m)});
      cv.dataset.scale = m;
      return cv;
    };
    return {idx, M, cell, S, lo, rows, Mt, tcell, dims, nD, dh,
      panels: [["learned (this model)", heat(simL), tab(Pp.learned)],
        ["sinusoidal (Vaswani et al.)", heat(simS), tab(Pp.sinusoid)]]};
  }

  function markedPositions(P, {idx, M, cell, S, lo, rows, Mt, tcell, dims, nD, dh, panels}, marked) {
    const padL = 46, gap = 54, top = 24, TH = nD * dh, ty = top + S + 60;
    const W = padL + 2 * S + gap + 16, H = ty + TH + 92;
    const cv = el("canvas", {width: W, height: H, id: "positions-canvas"});
    const ctx = cv.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    ctx.imageSmoothingEnabled = false;
    const ink = "#1d2330", muted = "#5c6577";
    const text = (s, x, y, {size = 10, color = muted, align = "left", rotate = false, bold = false} = {}) => {
      ctx.save();
      ctx.font = `${bold ? "600 " : ""}${size}px ${MONO}`; ctx.fillStyle = color; ctx.textAlign = align;
      ctx.translate(x, y);
      if (rotate) ctx.rotate(-Math.PI / 2);
      ctx.fillText(s, 0, 0);
      ctx.restore();
    };
    // an axis: ticks (index k -> label) along x (below y) or along y (left of x), and its title
    const xAxis = (x0, y, ticks, unit, title) => {
      ctx.fillStyle = muted;
      for (const [k, label] of ticks) {
        const x = x0 + k * unit + unit / 2;
        ctx.fillRect(Math.round(x), y, 1, 3);
        text(label, x, y + 12, {align: "center"});
      }
      text(title, x0 + ticks[ticks.length - 1][0] * unit / 2, y + 24, {align: "center", color: ink});
    };
    const yAxis = (x, y0, ticks, unit, title) => {
      ctx.fillStyle = muted;
      for (const [k, label] of ticks) {
        const y = y0 + k * unit + unit / 2;
        ctx.fillRect(x - 3, Math.round(y), 3, 1);
        text(label, x - 5, y + 3.5, {align: "right"});
      }
      text(title, x - 30, y0 + (ticks[ticks.length - 1][0] * unit) / 2, {align: "center", color: ink,
        rotate: true});
    };
    // the shown position nearest to the focused token's (positions may be shown every 2nd)
    let mk = -1;
    if (marked != null) for (let k = 0; k < M; k++) if (idx[k] <= marked) mk = k;
    const posTicks = ticksOf(M).map(k => [k, String(idx[k])]);
    const rowTicks = ticksOf(Mt).map(k => [k, String(rows[k])]);
    const dimTicks = ticksOf(nD).map(r => [r, String(dims[r])]);
    const step = nD > 1 ? dims[1] - dims[0] : 1;
    const which = step > 1 ? `dimensions ${dims[0]}, ${dims[1]}, …, ${dims[nD - 1]} (step ${step})`
      : `dimensions 0–${nD - 1}`;
    const geometry = panels.map(([title, hm, tb], p) => {
      const x0 = padL + p * (S + gap);
      text(title, x0, 14, {size: 12, color: ink, bold: true});
      ctx.drawImage(hm, x0, top);
      ctx.strokeStyle = "#d9dde5"; ctx.lineWidth = 1; ctx.strokeRect(x0 - .5, top - .5, S + 1, S + 1);
      xAxis(x0, top + S + 1, posTicks, cell, "position");
      yAxis(x0 - 1, top, posTicks, cell, "position");
      if (mk >= 0) { // the focused token's position: a row and a column
        ctx.strokeStyle = "#d35400";
        ctx.strokeRect(x0, top + mk * cell, S, cell); ctx.strokeRect(x0 + mk * cell, top, cell, S);
      }
      text(`the table, positions ${rows[0]}–${rows[Mt - 1]}`, x0, ty - 12, {size: 11, color: ink});
      ctx.drawImage(tb, x0, ty);
      xAxis(x0, ty + TH + 1, rowTicks, tcell, "position");
      yAxis(x0 - 1, ty, dimTicks, dh, "dimension");
      const mt = marked == null ? -1 : rows.indexOf(marked);
      if (mt >= 0) { // a mark above the table's column, leaving its colours to be read
        const x = x0 + mt * tcell + tcell / 2;
        ctx.fillStyle = "#d35400";
        ctx.beginPath(); ctx.moveTo(x - 4, ty - 6); ctx.lineTo(x + 4, ty - 6); ctx.lineTo(x, ty - 1); ctx.fill();
      }
      return {title, similarity: {x: x0, y: top, cell, size: S, x_axis: "position", y_axis: "position"},
        table: {x: x0, y: ty, cw: tcell, ch: dh, cols: Mt, rows: nD, x_axis: "position", y_axis: "dimension",
          scale: Number(tb.dataset.scale)}};
    });
    const spaced = M > 2 && idx[1] - idx[0] > 1 ? ` (${idx[0]}, ${idx[1]}, ${idx[2]}, …)` : "";
    [`matrices: the cosine of two position vectors, white = ${lo.toFixed(1)} … dark blue = 1,`,
      `          over ${M} positions${spaced}`,
      `tables: every position, ${which};`,
      "        blue < 0 < red, the largest 2% of a table's |values| saturate",
    ].forEach((s, k) => text(s, padL, H - 48 + 14 * k, {size: 10.5}));
    cv.dataset.axes = JSON.stringify({panels: geometry, position_ticks: posTicks.map(([, s]) => Number(s)),
      table_position_ticks: rowTicks.map(([, s]) => Number(s)), dimension_ticks: dimTicks.map(([, s]) => Number(s))});
    return cv;
  }

  function renderEmbeddings(box, P) {
    const T = P.tokens.length;
    const pick = el("select", {id: "embed-token", "aria-label": "token"},
      P.tokens.map(t => el("option", {value: t.i}, `${t.i} ${t.token}`)));
    pick.addEventListener("change", () => BL.set({token: Number(pick.value)}));
    const left = el("div", {class: "col"}), right = el("div", {class: "col"});
    box.append(
      el("div", {class: "controls"}, el("label", null, "token ", pick),
        el("span", {class: "note"}, "or point at any token on the page (click pins it)")),
      el("div", {class: "row"}, left, right));
    let figs = [];
    const draw = () => {
      const i = Math.min(T - 1, focusToken());
      pick.value = String(i);
      left.textContent = ""; right.textContent = "";
      const dec = decomposition(P, i), pc = positionsCanvas(P, i);
      left.append(el("figure", null, dec, el("figcaption", null,
        "The embedding layer adds three looked-up vectors and normalises the sum. Each strip is one " +
        "vector over its H dimensions (blue negative, red positive); the numbers are its first 8.")));
      if (pc) right.append(el("figure", null, pc, el("figcaption", null,
        "Each cell is the cosine between two position vectors. Sinusoids give a similarity that depends " +
        "only on the distance between positions (even bands along the diagonal); BERT learns its table " +
        "from data (reference 001 asks why), and what it learned is on the left: compare the diagonal " +
        "band's width and regularity. Below each: the table itself at its first positions, every one " +
        "(columns), over dimensions spread across all H (rows), each value its own pixels: the " +
        "sinusoids' wavelength grows with the dimension; compare the rows BERT learned.")));
      figs = [dec].concat(pc ? [pc] : []);
    };
    draw();
    BL.on((s, ch) => { if (ch.includes("token")) draw(); });
    view.figure = () => figs;
  }

  const view = {id: "embeddings", title: "Embeddings: word + position + segment, then LayerNorm",
    order: 20, render: renderEmbeddings, figure: () => []};
  BL.view(view);
})();
