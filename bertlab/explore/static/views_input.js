/* bertlab explore: the input side. "tokens": the text cut into word pieces; "embeddings": how
 * one token's input vector is built (word + position + segment, then LayerNorm, as reference 002
 * does by hand) and the position tables (reference 001: why BERT learns its positions). */
"use strict";

(() => {
  const {el, svg, fmt} = BL;
  const SEG = ["A", "B"];
  const MONO = 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", Menlo, monospace';

  // The focused token: the one under the pointer (or pinned), else the first word piece.
  const focusToken = () => BL.state.token ?? (BL.payload.tokens.length > 1 ? 1 : 0);

  // Width of a string in the page's monospace font (for SVG layout).
  const measure = (() => {
    const ctx = document.createElement("canvas").getContext("2d");
    return (s, px = 12) => { ctx.font = `${px}px ${MONO}`; return ctx.measureText(s).width; };
  })();

  // ============================================================ tokens

  function charsOf(t) {
    if (t.start == null) return null;
    const src = t.segment === 1 ? BL.payload.pair : BL.payload.text;
    return src == null ? null : src.slice(t.start, t.end);
  }

  // One line per segment: the text, each token's characters in a span (class "tok") so that
  // hovering a chip highlights them, and hovering them highlights the chip.
  // The characters the model read of each segment: after truncation, the text up to the last
  // kept piece (the rest is counted, not shown).
  function segments(P) {
    const segs = [P.text].concat(P.pair != null ? [P.pair] : []);
    return segs.map((txt, seg) => {
      if (!P.truncated) return {txt, cut: 0};
      const ends = P.tokens.filter(t => t.segment === seg && t.end != null).map(t => t.end);
      const end = ends.length ? Math.max(...ends) : 0;
      return {txt: txt.slice(0, end), cut: txt.length - end};
    });
  }

  function textLines(P) {
    return segments(P).map(({txt, cut}, seg) => {
      const line = el("div", {class: "text-line"}, el("span", {class: "seg-label"}, SEG[seg]));
      const spans = P.tokens.filter(t => t.segment === seg && t.start != null && t.end != null)
        .sort((a, b) => a.start - b.start);
      let pos = 0;
      for (const t of spans) {
        if (t.start < pos) continue; // overlapping offsets: keep the first
        if (t.start > pos) line.appendChild(document.createTextNode(txt.slice(pos, t.start)));
        line.appendChild(el("span", {class: "ch tok", "data-i": t.i}, txt.slice(t.start, t.end)));
        pos = t.end;
      }
      if (pos < txt.length) line.appendChild(document.createTextNode(txt.slice(pos)));
      if (cut) line.appendChild(el("span", {class: "muted"}, ` … and ${cut} more characters, cut off (truncated)`));
      return line;
    });
  }

  function chip(t) {
    const span = t.start == null ? "special" : `${SEG[t.segment]} ${t.start}–${t.end}`;
    const cls = ["chip", "tok", "seg" + t.segment, t.special ? "special" : "", t.masked ? "masked" : ""];
    return el("div", {class: cls.filter(Boolean).join(" "), "data-i": t.i,
      title: `token ${t.i}: id ${t.id}, segment ${SEG[t.segment]}` +
        (t.start == null ? "" : `, characters ${t.start}–${t.end}`)},
    el("span", {class: "piece"}, t.token),
    el("span", {class: "meta"}, `${t.i} · ${t.id}`),
    el("span", {class: "meta"}, span));
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
        "Each chip: the piece, its position · vocabulary id, and its segment and characters in the text. " +
        '"##" marks a piece that continues a word. Blue: segment A, orange: segment B, grey: special.'),
      el("div", {class: "chips", id: "token-chips"}, P.tokens.map(chip)),
      detail);
    BL.on((s, ch) => { if (ch.includes("token")) detail.textContent = tokenDetail(P); });
  }

  // The exported picture of the tokens view: the text and the chips, drawn in SVG.
  function tokensFigure() {
    const P = BL.payload, W = 1000, out = svg("svg", {width: W, height: 10});
    let y = 18;
    segments(P).forEach(({txt, cut}, seg) => {
      if (txt.length > 1300) { cut += txt.length - 1300; txt = txt.slice(0, 1300); }
      if (cut) txt += ` … (${cut} more characters)`;
      for (let k = 0; k < txt.length || k === 0; k += 130) {
        out.appendChild(svg("text", {x: 0, y, "font-family": MONO, "font-size": 13, fill: "#1d2330"},
          (k ? "  " : SEG[seg] + " ") + txt.slice(k, k + 130)));
        y += 18;
      }
    });
    let x = 0, right = 0;
    y += 8;
    const fills = ["#e7f0fb", "#fbefe2"];
    for (const t of P.tokens) {
      const meta = `${t.i} · ${t.id}`, w = Math.max(measure(t.token, 13), measure(meta, 10)) + 12;
      if (x + w > W) { x = 0; y += 42; }
      out.append(
        svg("rect", {x, y, width: w, height: 36, rx: 3, fill: t.special ? "#eceff3" : fills[t.segment],
          stroke: "#d9dde5"}),
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
  const absMax = (...vs) => vs.reduce((m, v) => v.reduce((mm, x) => Math.max(mm, Math.abs(x)), m), 1e-12);
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

  // One canvas: the two similarity matrices side by side with titles and position ticks, then the
  // first 64 dimensions of each table. The focused token's position is marked on both.
  const drawn = new WeakMap(); // payload -> its position pictures (drawn once, marked per token)
  function positionsCanvas(P, marked) {
    const Pp = P.embeddings.positions;
    if (!Pp) return null;
    if (!drawn.has(P)) drawn.set(P, positionPanels(P));
    return markedPositions(P, drawn.get(P), marked);
  }

  function positionPanels(P) {
    const Pp = P.embeddings.positions;
    const idx = BL.arr(Pp.index).data, M = idx.length;
    const cell = Math.max(1, Math.floor(240 / M)), S = cell * M;
    const simL = BL.arr(Pp.learned_similarity).data, simS = BL.arr(Pp.sinusoid_similarity).data;
    let lo = 0;
    for (let k = 0; k < simL.length; k++) lo = Math.min(lo, simL[k], simS[k]);
    const heat = d => BL.heatCanvas(M, M, (r, c) => d[r * M + c], {lo, hi: 1, cell});
    const tab = a => {
      const d = BL.arr(a).data, n = BL.arr(a).shape[1], m = absMax(d);
      return BL.heatCanvas(M, n, (r, c) => d[r * n + c], {cell: 1, rgb: v => BL.divergingRGB(v, m)});
    };
    return {idx, M, cell, S, panels: [["learned (this model)", heat(simL), tab(Pp.learned)],
      ["sinusoidal (Vaswani et al.)", heat(simS), tab(Pp.sinusoid)]]};
  }

  function markedPositions(P, {idx, M, cell, S, panels}, marked) {
    const pad = 34, gap = 40, top = 22, W = pad + 2 * S + gap + 10, tabH = 120;
    const cv = el("canvas", {width: W, height: top + S + 30 + tabH + 40, id: "positions-canvas"});
    const ctx = cv.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, cv.width, cv.height);
    ctx.font = `12px ${MONO}`; ctx.fillStyle = "#1d2330";
    // the shown position nearest to the focused token's (positions may be shown every 2nd)
    let mk = -1;
    if (marked != null) for (let k = 0; k < M; k++) if (idx[k] <= marked) mk = k;
    panels.forEach(([title, hm, tb], p) => {
      const x0 = pad + p * (S + gap);
      ctx.fillStyle = "#1d2330"; ctx.fillText(title, x0, 14);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(hm, x0, top);
      ctx.strokeStyle = "#d9dde5"; ctx.strokeRect(x0 - .5, top - .5, S + 1, S + 1);
      ctx.fillStyle = "#5c6577"; ctx.font = `10px ${MONO}`;
      ctx.fillText(String(idx[0]), x0 - 4 - ctx.measureText(String(idx[0])).width, top + 8);
      ctx.fillText(String(idx[M - 1]), x0 - 4 - ctx.measureText(String(idx[M - 1])).width, top + S);
      ctx.fillText(String(idx[M - 1]), x0 + S - ctx.measureText(String(idx[M - 1])).width, top + S + 12);
      if (mk >= 0) { // the focused token's position: a row and a column
        ctx.strokeStyle = "#d35400"; ctx.lineWidth = 1;
        ctx.strokeRect(x0, top + mk * cell, S, cell); ctx.strokeRect(x0 + mk * cell, top, cell, S);
      }
      const ty = top + S + 30;
      ctx.fillStyle = "#1d2330"; ctx.font = `11px ${MONO}`;
      ctx.fillText("the table, first 64 dims", x0, ty - 4);
      ctx.drawImage(tb, x0, ty, S, tabH);
      ctx.font = `12px ${MONO}`;
    });
    ctx.fillStyle = "#5c6577"; ctx.font = `11px ${MONO}`;
    ctx.fillText(`position × position cosine similarity, ${M} positions` +
      (M > 2 && idx[1] - idx[0] > 1 ? ` (${idx[0]}, ${idx[1]}, ${idx[2]}, …)` : ""), pad, cv.height - 8);
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
        "band's width and regularity.")));
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
