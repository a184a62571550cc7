/* hooktrace report viewer: vanilla JS, no build step, no network.
 * Every text from a trace reaches the page through textContent (never parsed as markup), after `S()`
 * shows control and bidi characters as visible escapes (as hooktrace's safe_text does). */
"use strict";
(function () {
  const ROW = { STEP: 0, PHASE: 1, CALL: 2, GROUP: 3, HOOK: 4, SAVED: 5, REPEAT: 6, GRAPH: 7 };
  const ROW_H = 22;
  // hooktrace's kinds, phases, scopes, event types, root label, badges and their colours, sent with
  // the data (render/html.py `words`, from kinds.py): this file spells none of them
  let WORDS = null;
  function Words(w) {
    this.kindColour = new Map(Object.entries(w.kind_colours));
    this.phases = new Map(Object.entries(w.phases));
    this.unknownPhase = w.unknown_phase; this.savedKind = w.saved_kind; this.root = w.root;
    this.HOOK = w.hook_event; this.ENTER = w.enter_event; this.GLOBAL = w.global_scope; this.badges = w.badges;
    this.internalErrors = w.internal_errors || [];
  }
  // PyTorch raising and catching its own exception (checkpoint stopping a recompute early): not an error
  function stoppedByPyTorch(err) { return WORDS.internalErrors.indexOf(String(err).split(":")[0].trim()) >= 0; }
  Words.prototype.title = function (phase) { const p = this.phases.get(phase); return p ? p.title : phase; };
  Words.prototype.band = function (phase) { return (this.phases.get(phase) || this.phases.get(this.unknownPhase)).band; };
  function paint(e, kind) { const c = WORDS.kindColour.get(kind); if (c) e.style.color = c; return e; }
  // the characters hooktrace's safe_text escapes (render/safe.py), sent with the data
  let UNSAFE = /[\u0000-\u001f\u007f-\u009f\u{d800}-\u{dfff}\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff\ufffe\uffff]/gu;

  function S(s) {
    if (s === null || s === undefined) return "";
    s = String(s);
    return s.replace(UNSAFE, (c) => {
      const n = c.codePointAt(0);
      if (n < 0x100) return "\\x" + n.toString(16).padStart(2, "0");
      return n < 0x10000 ? "\\u" + n.toString(16).padStart(4, "0") : "\\U" + n.toString(16).padStart(8, "0");
    });
  }
  function SL(s) { return String(s === null || s === undefined ? "" : s).split("\n").map(S).join("\n"); }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  // surprise text: `names` between backticks shown as code (as text nodes: never parsed as markup)
  function withCode(parent, text) {
    String(text === null || text === undefined ? "" : text).split("`").forEach((part, i) => {
      if (i % 2) parent.appendChild(el("code", "", S(part)));
      else if (part) parent.appendChild(document.createTextNode(S(part)));
    });
    return parent;
  }
  function span(parent, cls, text) { const e = el("span", cls, text); parent.appendChild(e); return e; }
  function plural(n, w) { return n + " " + (n === 1 ? w : w + "s"); }
  function fmtNs(ns) {
    if (ns < 0) return "-" + fmtNs(-ns);
    if (ns < 1e3) return Math.round(ns) + "ns";
    if (ns < 1e6) return (ns / 1e3).toFixed(1) + "µs";
    if (ns < 1e9) return (ns / 1e6).toFixed(2) + "ms";
    return (ns / 1e9).toFixed(2) + "s";
  }
  function modName(p) { return p === null || p === undefined ? "no module" : p === "" ? WORDS.root : S(p); }

  // ---- the model of one trace --------------------------------------------------------------------
  function Model(view) {
    const doc = view.trace;
    this.label = view.label; this.note = view.note; this.times = view.times; this.meta = doc.meta || {}; this.dryRun = view.dry_run || "";
    this.counts = view.counts || ""; this.hidden = view.hidden || "";
    this.modules = doc.modules || []; this.hooks = doc.hooks || []; this.surprises = doc.surprises || [];
    this.types = new Map(this.modules.map((m) => [m.path, m.type]));
    this.hookById = new Map(this.hooks.map((h) => [h.id, h]));
    const ev = doc.events || { count: 0, columns: {}, tables: {} };
    const c = ev.columns, t = ev.tables || {};
    const n = ev.count || 0;
    const table = (name) => { const col = c[name] || [], tab = t[name]; return tab ? col.map((i) => (i === null ? null : tab[i])) : col; };
    this.n = n;
    this.seq = c.seq || []; this.step = c.step || []; this.type = table("type"); this.phase = table("phase");
    this.module = table("module"); this.hook = c.hook || []; this.kind = table("kind"); this.thread = c.thread || [];
    this.threadIdent = t.thread ? table("thread") : this.thread;  // Python's thread ident (a v1 trace's column holds it)
    this.start = c.start_ns || []; this.dur = c.duration_ns || []; this.returned = c.returned || []; this.error = c.error || [];
    this.shapes = table("shapes"); // traced with --shapes: what each hook received and returned
    this.graph = c.graph || []; // torch.compile: the compiled graph a hook ran inside (no time of its own)
    this.bySeq = new Map();
    this.seqWidth = ("#" + this.seq.reduce((a, b) => Math.max(a, b), 0)).length;
    let dense = true;
    for (let i = 0; i < n; i++) if (this.seq[i] !== i) { dense = false; break; }
    if (!dense) for (let i = 0; i < n; i++) if (!this.bySeq.has(this.seq[i])) this.bySeq.set(this.seq[i], i);
    this.dense = dense;
    // hook events per hook id: how often it fired and where
    this.firings = new Map();
    for (let i = 0; i < n; i++) {
      if (this.type[i] !== WORDS.HOOK) continue;
      const id = this.hook[i];
      let l = this.firings.get(id);
      if (!l) this.firings.set(id, (l = []));
      l.push(i);
    }
    // rows of the call tree
    const r = view.rows;
    this.rows = r; this.nrows = r.type.length; this.strings = r.strings;
    this.parent = new Int32Array(this.nrows).fill(-1);
    const stack = [];
    for (let i = 0; i < this.nrows; i++) {
      while (stack.length && r.end[stack[stack.length - 1]] <= i) stack.pop();
      if (stack.length) this.parent[i] = stack[stack.length - 1];
      if (r.end[i] > i + 1) stack.push(i);
    }
    this.rowOfSeq = new Map();
    for (let i = 0; i < this.nrows; i++) {
      const k = r.type[i];
      if (k === ROW.HOOK) this.rowOfSeq.set(r.first[i], i);
    }
    for (let i = 0; i < this.nrows; i++) {  // an enter event's row is its call's row
      if (r.type[i] === ROW.CALL && !this.rowOfSeq.has(r.first[i])) this.rowOfSeq.set(r.first[i], i);
    }
    this.hookRows = new Int32Array(this.nrows + 1);  // prefix count of hook rows
    for (let i = 0; i < this.nrows; i++) this.hookRows[i + 1] = this.hookRows[i] + (r.type[i] === ROW.HOOK ? 1 : 0);
    this.marks = new Set(view.marks || []);
    this.calls = view.calls || { enter: [], end: [], depth: [] };
  }
  Model.prototype.ev = function (seq) { return this.dense ? (seq >= 0 && seq < this.n ? seq : -1) : (this.bySeq.has(seq) ? this.bySeq.get(seq) : -1); };
  Model.prototype.hookOf = function (i) { return this.hookById.get(this.hook[i]) || null; };
  Model.prototype.rowModule = function (i) { const m = this.rows.module[i]; return m < 0 ? null : this.strings[m]; };
  Model.prototype.badges = function (h, i) {
    const out = [], B = WORDS.badges;
    if (h) {
      if (h.prepend) out.push(h.prepend_source === "inferred" ? B.prepend_inferred : B.prepend);
      if (h.scope === WORDS.GLOBAL) out.push(B[WORDS.GLOBAL]);
      if (h.with_kwargs) out.push(B.with_kwargs);
      if (h.always_call) out.push(B.always_call);
      if (h.registered_during_run) out.push(B.registered_during_run);
    }
    if (i !== undefined && i >= 0) {
      if (this.returned[i]) out.push(B.returned);
      if (this.error[i] !== null && this.error[i] !== undefined && !stoppedByPyTorch(this.error[i])) out.push(B.error);
      if (this.graph[i] !== null && this.graph[i] !== undefined) out.push(B.compiled);
    }
    return out;
  };
  Model.prototype.location = function (where) {
    if (!where) return "";
    const target = this.meta.target || "";
    if (target) {
      let head = target.includes(":") ? target.slice(0, target.lastIndexOf(":")) : target;
      if (!head.endsWith(".py")) head = head.replace(/\./g, "/") + ".py";
      const colon = where.lastIndexOf(":");
      const file = where.slice(0, colon);
      if (file === head || file.endsWith("/" + head)) return S(head.split("/").pop() + where.slice(colon));
    }
    return S(where);
  };

  // ---- filters -----------------------------------------------------------------------------------
  function Filter() { this.text = ""; this.kind = ""; this.phase = ""; this.badge = ""; }
  Filter.prototype.active = function () { return !!(this.text || this.kind || this.phase || this.badge); };

  // ---- one pane: timeline and tree of one model --------------------------------------------------
  function Pane(app, model, host) {
    this.app = app; this.m = model;
    const rows = model.rows;
    this.collapsed = new Uint8Array(model.nrows);
    for (let i = 0; i < model.nrows; i++) if (rows.type[i] === ROW.REPEAT || rows.type[i] === ROW.SAVED) this.collapsed[i] = 1;
    this.fcollapsed = new Uint8Array(model.nrows);
    this.match = null;      // Uint8Array per row when a filter is active: the row or a descendant matches
    this.hl = new Set();    // highlighted event seqs
    this.selected = -1;     // selected row
    this.hasMark = new Uint8Array(model.nrows);
    for (let i = model.nrows - 1; i >= 0; i--) {
      if ((rows.type[i] === ROW.HOOK || rows.type[i] === ROW.CALL) && model.marks.has(rows.first[i])) this.hasMark[i] |= 2;
      if (this.hasMark[i] && model.parent[i] >= 0) this.hasMark[model.parent[i]] |= 1;
    }
    this.markRows = [];
    for (let i = 0; i < model.nrows; i++) if (this.hasMark[i] & 2) { this.markRows.push(i); this.reveal(i); }
    this.markAt = -1;
    this.build(host);
    this.timeline = new Timeline(this, this.tl);
    this.refresh();
  }
  Pane.prototype.build = function (host) {
    const m = this.m;
    const pane = el("div", "pane");
    const head = el("div", "phead");
    this.head = head;
    span(head, "plabel", S(m.label));
    if (m.note) span(head, "pnote", S(m.note));
    const nh = m.hookRows[m.nrows];
    // the counts every rendering gives, in the same words (hook calls, module calls)
    span(head, "pnote", m.counts ? S(m.counts) : plural(nh, "hook call"));
    if (m.hidden) span(head, "pnote", S(m.hidden));
    span(head, "spacer");
    if (this.markRows.length) {
      const ranks = this.app.data.mode === "ranks";
      const b = el("button", "btn", (ranks ? "divergence" : "next difference") + " (" + this.markRows.length + ")");
      b.title = "Jump to the next hook call marked in red";
      b.addEventListener("click", () => this.nextMark());
      head.appendChild(b);
    }
    const expand = el("button", "btn", "expand all");
    expand.title = "Expand every row, repeats included";
    expand.addEventListener("click", () => { this.collapsed.fill(0); this.fcollapsed.fill(0); this.refresh(); });
    const collapse = el("button", "btn", "collapse");
    collapse.title = "Collapse the repeated siblings again";
    collapse.addEventListener("click", () => {
      for (let i = 0; i < m.nrows; i++) this.collapsed[i] = (m.rows.type[i] === ROW.REPEAT || m.rows.type[i] === ROW.SAVED) ? 1 : 0;
      this.refresh();
    });
    head.appendChild(expand); head.appendChild(collapse);
    pane.appendChild(head);
    this.tl = el("div", "timeline");
    pane.appendChild(this.tl);
    this.tree = el("div", "tree");
    this.tree.setAttribute("role", "tree");
    this.spacer = el("div", "spacer");
    this.tree.appendChild(this.spacer);
    pane.appendChild(this.tree);
    if (!m.nrows) {
      this.tree.appendChild(el("div", "empty", m.n ? "No hooks fired (" + plural(m.n, "event") + " traced)." : "No events in this trace."));
    }
    let pending = false;
    this.tree.addEventListener("scroll", () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => { pending = false; this.draw(); });
    });
    this.tree.addEventListener("click", (ev) => this.onClick(ev));
    // only the rows in view are drawn: draw again when the tree's box grows (a larger window)
    let lastH = 0;
    const grown = () => {
      const h = this.tree.clientHeight;
      if (h === lastH || pending) return;
      lastH = h; pending = true;
      requestAnimationFrame(() => { pending = false; this.draw(); });
    };
    if (window.ResizeObserver) new ResizeObserver(grown).observe(this.tree);
    window.addEventListener("resize", grown);
    host.appendChild(pane);
    this.el = pane;
  };
  Pane.prototype.computeVisible = function () {
    const m = this.m, end = m.rows.end, n = m.nrows;
    const out = new Int32Array(n);
    let k = 0;
    const match = this.match, col = match ? this.fcollapsed : this.collapsed;
    for (let i = 0; i < n;) {
      if (match && !match[i]) { i = end[i]; continue; }
      out[k++] = i;
      i = col[i] ? end[i] : i + 1;
    }
    this.visible = out.subarray(0, k);
  };
  Pane.prototype.refresh = function () {
    this.computeVisible();
    this.spacer.style.height = this.visible.length * ROW_H + "px";
    this.draw();
    this.timeline.draw();
  };
  Pane.prototype.draw = function () {
    const top = this.tree.scrollTop, h = this.tree.clientHeight || 600;
    const a = Math.max(0, Math.floor(top / ROW_H) - 10), b = Math.min(this.visible.length, Math.ceil((top + h) / ROW_H) + 10);
    const frag = document.createDocumentFragment();
    for (let k = a; k < b; k++) frag.appendChild(this.rowEl(this.visible[k], k));
    this.spacer.replaceChildren(frag);
  };
  Pane.prototype.rowEl = function (i, k) {
    const m = this.m, r = m.rows, t = r.type[i];
    const row = el("div", "row");
    row.style.top = k * ROW_H + "px";
    row.style.paddingLeft = 6 + r.depth[i] * 16 + "px";
    row.dataset.row = i;
    row.setAttribute("role", "treeitem");
    const kids = r.end[i] > i + 1;
    const col = this.match ? this.fcollapsed : this.collapsed;
    const tog = span(row, "tog", kids ? (col[i] ? "▸" : "▾") : "");
    if (kids) { tog.dataset.toggle = i; row.setAttribute("aria-expanded", col[i] ? "false" : "true"); }
    if (t === ROW.HOOK) this.hookLabel(row, i);
    else if (t === ROW.CALL || t === ROW.GROUP) {
      const mod = m.rowModule(i);
      span(row, "mod", modName(mod));
      const ty = m.types.get(mod);
      if (ty) span(row, "dim", " " + S(ty));
      if (t === ROW.CALL) span(row, "dim", "  call #" + r.first[i] + "–#" + r.last[i]);
      const ei = m.ev(r.first[i]);
      if (t === ROW.CALL && ei >= 0 && m.type[ei] === WORDS.ENTER && m.dur[ei]) span(row, "dim", "  " + fmtNs(m.dur[ei]));
      const err = r.errors[i] === undefined ? undefined : r.errors[i].replace(/[:\s]+$/, "");
      if (err !== undefined) {
        if (stoppedByPyTorch(err)) span(row, "stopped", "  stopped by PyTorch: " + S(err));
        else span(row, "err", "  raised " + S(err));
      }
    } else if (t === ROW.GRAPH) {
      span(row, "mod", "compiled graph " + r.extra[i] + " (hooks in program order)");
      span(row, "dim", "  run #" + r.first[i] + "–#" + r.last[i]);
    } else if (t === ROW.PHASE) {
      row.classList.add("phase");
      const p = m.strings[r.extra[i]];
      span(row, "", S(WORDS.title(p)));
      span(row, "dim", "  " + plural(m.hookRows[r.end[i]] - m.hookRows[i], "hook call"));
    } else if (t === ROW.STEP) {
      row.classList.add("step");
      span(row, "", "step " + r.extra[i]);
    } else if (t === ROW.SAVED) {
      const counts = {};
      const names = new Set();
      for (let j = i + 1; j < r.end[i]; j++) {
        const ei = m.ev(r.first[j]);
        if (ei < 0) continue;
        counts[m.kind[ei]] = (counts[m.kind[ei]] || 0) + 1;
        const h = m.hookOf(ei);
        names.add(h ? S(h.name) : "<unknown hook " + m.hook[ei] + ">");
      }
      span(row, "seq", "#" + r.first[i] + "–#" + r.last[i] + " ");
      paint(span(row, "", "saved tensors "), WORDS.savedKind);
      span(row, "", Object.keys(counts).map((k) => counts[k] + " " + S(k)).join(", "));
      span(row, "hname", "  " + Array.from(names).join(", "));
    } else if (t === ROW.REPEAT) {
      row.classList.add("repeat");
      const n = r.extra[i];
      let last = i + 1;
      for (let j = i + 1; j < r.end[i]; j = r.end[j]) last = j;
      const a = modName(m.rowModule(i + 1)), b = modName(m.rowModule(last));
      span(row, "", "×" + n + " more with the same order");
      const hooks = m.hookRows[r.end[i]] - m.hookRows[i];
      span(row, "sum", " (" + (a === b ? a : a + " … " + b) + ", #" + r.first[i] + "–#" + r.last[i] + ", " + plural(hooks, "hook call") + ")");
    }
    if (this.hasMark[i] & 2) row.classList.add("mark");
    else if (this.hasMark[i] && col[i]) span(row, "dot").title = "differences inside";
    if (t === ROW.HOOK && this.hl.has(r.first[i])) row.classList.add("hl");
    else if (t === ROW.CALL && this.hl.has(r.first[i])) row.classList.add("hl");
    if (i === this.selected) row.classList.add("sel");
    return row;
  };
  Pane.prototype.hookLabel = function (row, i) {
    const m = this.m, r = m.rows, seq = r.first[i], ei = m.ev(seq);
    span(row, "seq", ("#" + seq).padEnd(m.seqWidth) + " ");  // one width: the kinds and names line up
    if (ei < 0) { span(row, "err", "missing event"); return; }
    const h = m.hookOf(ei), raw = m.kind[ei] || (h ? h.kind : null), kind = S(raw || "hook");
    paint(span(row, "kind", kind + " "), raw);
    span(row, "hname", h ? S(h.name) : "<unknown hook " + m.hook[ei] + ">");
    const parent = m.parent[i] >= 0 ? m.rows.type[m.parent[i]] : -1;
    const pmod = parent === ROW.CALL || parent === ROW.GROUP ? m.rowModule(m.parent[i]) : undefined;
    if (h && h.tensor) span(row, "dim", " on " + S(h.tensor));
    else if (m.module[ei] !== null && m.module[ei] !== pmod) span(row, "dim", " for " + modName(m.module[ei]));
    for (const b of m.badges(h, ei)) span(row, "badge " + b.split(" ")[0], b);
    if (m.dur[ei]) span(row, "dim", "  " + fmtNs(m.dur[ei]));
    if (h && h.defined_at) span(row, "dim", "  " + m.location(h.defined_at));
    if (m.error[ei] !== null && m.error[ei] !== undefined) {
      if (stoppedByPyTorch(m.error[ei])) span(row, "stopped", "  stopped by PyTorch: " + S(String(m.error[ei]).replace(/[:\s]+$/, "")));
      else span(row, "err", "  error: " + S(m.error[ei]));
    }
    if (m.shapes[ei] !== null && m.shapes[ei] !== undefined) { span(row, "shapes", "  " + S(m.shapes[ei])); row.title = S(m.shapes[ei]); }
  };
  Pane.prototype.onClick = function (ev) {
    const tog = ev.target.closest("[data-toggle]");
    if (tog) { this.toggle(+tog.dataset.toggle); return; }
    const row = ev.target.closest(".row");
    if (row) this.select(+row.dataset.row, false);
  };
  Pane.prototype.toggle = function (i) {
    const col = this.match ? this.fcollapsed : this.collapsed;
    col[i] = col[i] ? 0 : 1;
    this.refresh();
  };
  Pane.prototype.reveal = function (i) {  // expand every ancestor of row i
    for (let p = this.m.parent[i]; p >= 0; p = this.m.parent[p]) { this.collapsed[p] = 0; this.fcollapsed[p] = 0; }
  };
  Pane.prototype.scrollTo = function (i) {
    let k = -1;
    for (let j = 0; j < this.visible.length; j++) if (this.visible[j] === i) { k = j; break; }
    if (k < 0) return;
    const top = k * ROW_H, h = this.tree.clientHeight || 600;
    if (top < this.tree.scrollTop || top > this.tree.scrollTop + h - ROW_H * 2) this.tree.scrollTop = Math.max(0, top - h / 3);
    this.draw();
  };
  Pane.prototype.select = function (i, scroll) {
    this.selected = i;
    if (scroll) { this.reveal(i); this.refresh(); this.scrollTo(i); } else { this.draw(); this.timeline.draw(); }
    this.app.showDetails(this, i);
  };
  Pane.prototype.selectSeq = function (seq) {
    const i = this.m.rowOfSeq.get(seq);
    if (i !== undefined) this.select(i, true);
  };
  Pane.prototype.highlight = function (seqs) {
    this.hl = new Set(seqs);
    let first = -1;
    for (const s of seqs) {
      const i = this.m.rowOfSeq.get(s);
      if (i === undefined) continue;
      this.reveal(i);
      if (first < 0 || i < first) first = i;
    }
    this.refresh();
    if (first >= 0) this.scrollTo(first);
    this.timeline.focus(seqs);
  };
  Pane.prototype.nextMark = function () {
    if (!this.markRows.length) return;
    this.markAt = (this.markAt + 1) % this.markRows.length;
    this.select(this.markRows[this.markAt], true);
    this.timeline.focus([this.m.rows.first[this.markRows[this.markAt]]]);
  };
  Pane.prototype.applyFilter = function (f) {
    const m = this.m, r = m.rows, n = m.nrows;
    if (!f.active()) { this.match = null; this.evMatch = null; this.refresh(); return 0; }
    const text = f.text.toLowerCase();
    const hookText = new Map(), modText = new Map(), hookBadges = new Map();
    const evMatch = new Uint8Array(m.n);
    let count = 0;
    for (let e = 0; e < m.n; e++) {
      if (m.type[e] !== WORDS.HOOK) continue;
      if (f.kind && m.kind[e] !== f.kind) continue;
      if (f.phase && m.phase[e] !== f.phase) continue;
      const id = m.hook[e];
      if (f.badge) {
        if (f.badge === WORDS.badges.returned) { if (!m.returned[e]) continue; }
        else if (f.badge === WORDS.badges.error) { if (m.error[e] === null || m.error[e] === undefined || stoppedByPyTorch(m.error[e])) continue; }
        else {
          if (!hookBadges.has(id)) hookBadges.set(id, m.badges(m.hookOf(e)).includes(f.badge));
          if (!hookBadges.get(id)) continue;
        }
      }
      if (text) {
        if (!hookText.has(id)) {
          const h = m.hookOf(e);
          hookText.set(id, !!h && [h.name, h.tensor, h.module, h.defined_at].some((x) => x !== null && x !== undefined && String(x).toLowerCase().includes(text)));
        }
        let ok = hookText.get(id);
        if (!ok) {
          const mod = m.module[e];
          if (!modText.has(mod)) modText.set(mod, mod !== null && mod !== undefined && mod.toLowerCase().includes(text));
          ok = modText.get(mod);
        }
        if (!ok) continue;
      }
      evMatch[e] = 1; count++;
    }
    const match = new Uint8Array(n);
    for (let i = n - 1; i >= 0; i--) {
      if (r.type[i] === ROW.HOOK) { const e = m.ev(r.first[i]); if (e >= 0 && evMatch[e]) match[i] = 1; }
      if (match[i] && m.parent[i] >= 0) match[m.parent[i]] = 1;
    }
    this.match = match; this.evMatch = evMatch;
    this.fcollapsed.fill(0);
    this.tree.scrollTop = 0;
    this.refresh();
    return count;
  };

  // ---- timeline ----------------------------------------------------------------------------------
  function Timeline(pane, host) {
    this.pane = pane; this.m = pane.m; this.host = host;
    const m = this.m;
    const canvas = el("canvas");
    canvas.setAttribute("aria-label", "timeline of the events, one lane per thread");
    host.appendChild(canvas);
    this.canvas = canvas;
    const tools = el("div", "tools");
    for (const [label, f, title] of [["−", () => this.zoom(1.6), "zoom out"], ["+", () => this.zoom(1 / 1.6), "zoom in"], ["fit", () => this.fit(), "show everything"], ["time", () => this.toggleMode(), "x axis: time (as measured) or event order (#seq)"]]) {
      const b = el("button", "btn", label); b.title = title; b.addEventListener("click", f); tools.appendChild(b);
      if (label === "time") this.modeButton = b;
    }
    host.appendChild(tools);
    this.tools = tools;
    this.tip = el("div", "tip"); document.body.appendChild(this.tip);
    this.index(autoMode(m));
    this.bind();
  }
  Timeline.prototype.index = function (mode) {
    const m = this.m;
    this.mode = mode;
    const S = (this.S = new Float64Array(m.n)), D = (this.D = new Float64Array(m.n));
    for (let e = 0; e < m.n; e++) {
      if (mode === "order") { S[e] = m.seq[e]; D[e] = m.type[e] === WORDS.HOOK ? 0.7 : 0; }
      else { S[e] = m.start[e]; D[e] = m.dur[e] || 0; }
    }
    // lanes per thread; hooks and module calls sorted by start
    const lanes = new Map();
    const lane = (th) => { let l = lanes.get(th); if (!l) lanes.set(th, (l = { thread: th, hooks: [], calls: [], depth: 0, stack: [] })); return l; };
    let t0 = Infinity, t1 = -Infinity;
    for (let e = 0; e < m.n; e++) {
      const s = S[e], d = D[e];
      if (s < t0) t0 = s;
      if (s + d > t1) t1 = s + d;
      const l = lane(m.thread[e]);
      if (m.type[e] === WORDS.HOOK) l.hooks.push(e);
    }
    const cs = m.calls;  // paired in Python by analysis.calls, as every renderer pairs them
    for (let k = 0; k < cs.enter.length; k++) {
      const a = m.ev(cs.enter[k]);
      if (a < 0) continue;
      const z = cs.end[k] >= 0 ? m.ev(cs.end[k]) : -1;
      let end;
      if (mode === "order") end = z >= 0 ? S[z] + 1 : t1;
      else end = D[a] ? S[a] + D[a] : z >= 0 ? S[z] : t1;
      const l = lane(m.thread[a]), depth = cs.depth[k];
      l.calls.push([S[a], Math.max(end, S[a]), depth, a]);
      if (depth + 1 > l.depth) l.depth = depth + 1;
    }
    if (!isFinite(t0)) { t0 = 0; t1 = 1; }
    if (t1 <= t0) t1 = t0 + 1;
    this.lanes = Array.from(lanes.values());
    for (const l of this.lanes) {
      l.hooks.sort((a, b) => S[a] - S[b]);
      l.hookStart = Float64Array.from(l.hooks, (e) => S[e]);
      l.calls.sort((a, b) => a[0] - b[0]);
      l.callStart = Float64Array.from(l.calls, (c) => c[0]);
      l.depth = Math.min(l.depth, 8);
    }
    // phase bands: runs of one (step, phase) in seq order
    this.bands = [];
    let cur = null;
    for (let e = 0; e < m.n; e++) {
      const key = m.step[e] + "/" + m.phase[e];
      const s = S[e], end = s + D[e];
      if (!cur || cur.key !== key) { cur = { key, phase: m.phase[e], step: m.step[e], a: s, b: end }; this.bands.push(cur); }
      else { if (s < cur.a) cur.a = s; if (end > cur.b) cur.b = end; }
    }
    this.t0 = t0; this.t1 = t1;
    const pad = (t1 - t0) * 0.01; this.v0 = t0 - pad; this.v1 = t1 + pad;
    this.layout();
  };
  Timeline.prototype.layout = function () {
    let y = 18;
    for (const l of this.lanes) { l.y = y; l.callsH = l.depth * 6; l.h = 16 + l.callsH + 18; y += l.h + 4; }
    this.height = Math.max(y + 4, 60);
    this.host.style.height = Math.min(Math.max(this.height, 90), 260) + "px";
  };
  function autoMode(m) {
    // time, unless one stretch (a first call's warm-up) takes most of it: then event order
    if (m.n < 3) return "time";
    let lo = Infinity, hi = -Infinity;
    for (let e = 0; e < m.n; e++) { lo = Math.min(lo, m.start[e]); hi = Math.max(hi, m.start[e] + (m.dur[e] || 0)); }
    const order = Float64Array.from(m.start).sort();
    let big = 0;
    for (let k = 1; k < order.length; k++) big = Math.max(big, order[k] - order[k - 1]);
    return big > 0.5 * (hi - lo) ? "order" : "time";
  }
  Timeline.prototype.toggleMode = function () {
    this.index(this.mode === "order" ? "time" : "order");
    this.fit();
  };
  Timeline.prototype.fit = function () { const pad = (this.t1 - this.t0) * 0.01; this.v0 = this.t0 - pad; this.v1 = this.t1 + pad; this.draw(); };
  Timeline.prototype.zoom = function (f, at) {
    const w = this.v1 - this.v0, c = at === undefined ? (this.v0 + this.v1) / 2 : at;
    const nw = Math.max(Math.min(w * f, (this.t1 - this.t0) * 4), this.mode === "order" ? 5 : 50);
    this.v0 = c - (c - this.v0) * (nw / w); this.v1 = this.v0 + nw;
    this.draw();
  };
  Timeline.prototype.focus = function (seqs) {
    const m = this.m;
    let a = Infinity, b = -Infinity;
    for (const s of seqs) { const e = m.ev(s); if (e < 0) continue; a = Math.min(a, this.S[e]); b = Math.max(b, this.S[e] + this.D[e]); }
    if (!isFinite(a)) { this.draw(); return; }
    const w = this.v1 - this.v0, want = Math.max((b - a) * 2.5, (this.t1 - this.t0) / 40, this.mode === "order" ? 20 : 200);
    const nw = Math.min(w, want), c = (a + b) / 2;
    if (nw < w || a < this.v0 || b > this.v1) { this.v0 = c - nw / 2; this.v1 = c + nw / 2; }
    this.draw();
  };
  // the x axis: ticks at least ~90 px apart (their labels never run into each other in a narrow
  // pane), none before the first event (nothing happened there; a focus may show room before it)
  Timeline.prototype.ticks = function () {
    const W = this.w || this.host.clientWidth || 800, out = [];
    const span = this.v1 - this.v0, stepNs = Math.max(niceStep(span / Math.max(2, Math.floor(W / 90))), this.mode === "order" ? 1 : 0);
    const base = this.mode === "order" ? 0 : this.t0;
    for (let t = Math.max(0, Math.ceil((this.v0 - base) / stepNs)) * stepNs + base; t < this.v1; t += stepNs) {
      out.push({ x: this.x(t), label: this.mode === "order" ? "#" + Math.round(t) : fmtNs(t - this.t0) });
    }
    return out;
  };
  Timeline.prototype.x = function (t) { return (t - this.v0) / (this.v1 - this.v0) * this.w; };
  Timeline.prototype.t = function (x) { return this.v0 + x / this.w * (this.v1 - this.v0); };
  Timeline.prototype.bind = function () {
    const c = this.canvas;
    c.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const r = c.getBoundingClientRect();
      if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) { const dt = ev.deltaX / this.w * (this.v1 - this.v0); this.v0 += dt; this.v1 += dt; this.draw(); }
      else this.zoom(Math.pow(1.0015, ev.deltaY), this.t(ev.clientX - r.left));
    }, { passive: false });
    let drag = null;
    c.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, v0: this.v0, v1: this.v1, moved: false }; c.classList.add("dragging"); });
    window.addEventListener("mouseup", (ev) => {
      if (!drag) return;
      c.classList.remove("dragging");
      const was = drag; drag = null;
      if (!was.moved) { const hit = this.hit(ev); if (hit >= 0) this.pane.selectSeq(this.m.seq[hit]); }
    });
    window.addEventListener("mousemove", (ev) => {
      if (drag) {
        const dx = ev.clientX - drag.x;
        if (Math.abs(dx) > 2) drag.moved = true;
        const dt = dx / this.w * (drag.v1 - drag.v0);
        this.v0 = drag.v0 - dt; this.v1 = drag.v1 - dt; this.draw();
        return;
      }
      if (ev.target !== c) { this.tip.style.display = "none"; return; }
      const hit = this.hit(ev);
      if (hit < 0) { this.tip.style.display = "none"; return; }
      const m = this.m, h = m.hookOf(hit);
      const lines = [];
      if (m.type[hit] === WORDS.HOOK) lines.push("#" + m.seq[hit] + " " + S(m.kind[hit]) + " " + (h ? S(h.name) : "hook " + m.hook[hit]));
      else lines.push("call " + modName(m.module[hit]) + " #" + m.seq[hit]);
      lines.push(modName(m.module[hit]) + " · " + S(m.phase[hit]) + " · step " + m.step[hit] + " · " + fmtNs(m.dur[hit] || 0));
      this.tip.textContent = lines.join("\n");
      this.tip.style.display = "block";
      this.tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 300) + "px";
      this.tip.style.top = ev.clientY + 14 + "px";
    });
    c.addEventListener("mouseleave", () => { this.tip.style.display = "none"; });
    if (window.ResizeObserver) new ResizeObserver(() => this.draw()).observe(this.host);
  };
  function lowerBound(arr, v) { let a = 0, b = arr.length; while (a < b) { const k = (a + b) >> 1; if (arr[k] < v) a = k + 1; else b = k; } return a; }
  Timeline.prototype.hit = function (ev) {
    const r = this.canvas.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top + this.scroll;
    const m = this.m;
    for (const l of this.lanes) {
      if (y < l.y || y > l.y + l.h) continue;
      const t = this.t(x), slack = 4 / this.w * (this.v1 - this.v0);
      if (y >= l.y + 16 + l.callsH) {
        let best = -1, bd = Infinity;
        for (let k = Math.max(0, lowerBound(l.hookStart, t - slack) - 1); k < l.hooks.length && l.hookStart[k] <= t + slack; k++) {
          const e = l.hooks[k], s = this.S[e], d = Math.abs(t < s ? s - t : t > s + this.D[e] ? t - s - this.D[e] : 0);
          if (d < bd) { bd = d; best = e; }
        }
        return bd <= slack ? best : -1;
      }
      const depth = Math.floor((y - l.y - 16) / 6);
      for (let k = lowerBound(l.callStart, t) - 1; k >= 0; k--) {
        const cl = l.calls[k];
        if (cl[2] === depth && cl[0] <= t && cl[1] >= t) return cl[3];
        if (l.callStart[k] < t - (this.t1 - this.t0)) break;
      }
    }
    return -1;
  };
  Timeline.prototype.draw = function () {
    const c = this.canvas, dpr = window.devicePixelRatio || 1;
    const W = this.host.clientWidth || 800, H = this.host.clientHeight || 150;
    if (c.width !== Math.round(W * dpr) || c.height !== Math.round(H * dpr)) { c.width = Math.round(W * dpr); c.height = Math.round(H * dpr); }
    this.w = W; this.scroll = 0;
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, W, H);
    g.font = "10.5px system-ui, sans-serif";
    const m = this.m, pane = this.pane;
    // phase bands
    const toolsW = this.tools ? this.tools.offsetWidth + 12 : 0;
    this.labels = [];  // the band labels drawn (read by the tests)
    const bandPx = {};  // phase -> the last pixel column a narrow band of it filled
    let labelEnd = -Infinity;  // where the last label drawn ends: labels never run together
    for (let i = 0; i < this.bands.length; i++) {
      const b = this.bands[i], x0 = this.x(b.a), x1 = this.x(b.b);
      if (x1 < 0 || x0 > W) continue;
      if (x1 - x0 < 1) {  // phases alternating faster than pixels: one band per pixel and phase
        const px = Math.floor(x0);
        if (bandPx[b.phase] === px) continue;
        bandPx[b.phase] = px;
      }
      g.fillStyle = WORDS.band(b.phase);
      g.fillRect(x0, 0, Math.max(1, x1 - x0), H);
      // the band's label only where it fits whole: inside its band, before the next band begins
      // (a band spans its events' durations, so a backward band can hold the recompute band its
      // unpack hook ran), after the last label, left of the zoom buttons
      const next = i + 1 < this.bands.length ? this.x(this.bands[i + 1].a) : Infinity;
      const lx = Math.max(x0, 0) + 4;
      const room = lx < labelEnd + 6 ? 0 : Math.min(x1, next > x0 ? next : x1, W - toolsW) - Math.max(x0, 0) - 8;
      const long = S(b.phase) + (this.multiStep() ? " · step " + b.step : ""), short = S(b.phase);
      const label = g.measureText(long).width <= room ? long : (g.measureText(short).width <= room ? short : "");
      if (label) {
        const w = g.measureText(label).width;
        g.fillStyle = "#6b7480"; g.fillText(label, lx, 11);
        this.labels.push({ x: lx, w, text: label, right: W - toolsW });
        labelEnd = lx + w;
      }
    }
    // time axis
    g.fillStyle = "#8a929c"; g.strokeStyle = "rgba(0,0,0,0.06)";
    if (this.modeButton) this.modeButton.textContent = this.mode === "order" ? "x: order" : "x: time";
    for (const tick of this.ticks()) {
      g.beginPath(); g.moveTo(tick.x, 14); g.lineTo(tick.x, H); g.stroke();
      g.fillText(tick.label, tick.x + 2, H - 3);
    }
    const filtered = pane.evMatch;
    for (const l of this.lanes) {
      g.fillStyle = "#4a5563";
      g.fillText("thread " + (this.lanes.indexOf(l) + 1), 4, l.y + 11);
      // module calls as nested bars
      const callsTop = l.y + 16;
      let k0 = 0;
      const lastPx = new Float64Array(9).fill(-1);
      for (let k = k0; k < l.calls.length; k++) {
        const cl = l.calls[k];
        if (cl[0] > this.v1) break;
        if (cl[1] < this.v0 || cl[2] >= 8) continue;
        const x0 = Math.max(this.x(cl[0]), -1), x1 = Math.min(this.x(cl[1]), W + 1);
        if (x1 - x0 < 1 && Math.floor(x0) === lastPx[cl[2]]) continue;
        lastPx[cl[2]] = Math.floor(x0);
        g.fillStyle = pane.hl.has(m.seq[cl[3]]) ? "#e0a800" : "rgba(74,85,99," + (0.28 + 0.06 * cl[2]) + ")";
        g.fillRect(x0, callsTop + cl[2] * 6, Math.max(1, x1 - x0 - 0.5), 5);
        if (x1 - x0 > 60 && cl[2] === 0) { g.fillStyle = "#fff"; }
      }
      // hook marks
      const hy = callsTop + l.callsH + 2;
      let px = -2, lastColor = null, lastAlpha = 1;
      const a = Math.max(0, lowerBound(l.hookStart, this.v0 - span * 0.01) - 1);
      for (let k = a; k < l.hooks.length; k++) {
        const e = l.hooks[k], s = this.S[e];
        if (s > this.v1) break;
        const x0 = this.x(s), x1 = this.x(s + this.D[e]);
        if (x1 < 0) continue;
        const dim = filtered && !filtered[e];
        if (Math.floor(x0) === px && x1 - x0 < 1) continue;
        px = Math.floor(x0);
        const color = WORDS.kindColour.get(m.kind[e]) || "#555", alpha = dim ? 0.12 : 1;
        if (color !== lastColor) { g.fillStyle = color; lastColor = color; }
        if (alpha !== lastAlpha) { g.globalAlpha = alpha; lastAlpha = alpha; }
        g.fillRect(x0, hy, Math.max(1.5, x1 - x0), 14);
      }
      g.globalAlpha = 1;
      // marks (diff / divergence), highlights, selection: drawn on top, always visible
      const special = [];
      for (const s of m.marks) special.push([s, "#c53030"]);
      for (const s of pane.hl) special.push([s, "#e0a800"]);
      if (pane.selected >= 0) special.push([m.rows.first[pane.selected], "#2f6fde"]);
      for (const [s, color] of special) {
        const e = m.ev(s);
        if (e < 0 || m.thread[e] !== l.thread) continue;
        const x0 = this.x(this.S[e]);
        if (x0 < -4 || x0 > W + 4) continue;
        const w = Math.max(3, this.x(this.S[e] + this.D[e]) - x0);
        g.strokeStyle = color; g.lineWidth = 2;
        g.strokeRect(x0 - 1.5, hy - 2, w + 3, 18);
        g.fillStyle = color; g.beginPath(); g.moveTo(x0 + w / 2 - 4, hy - 7); g.lineTo(x0 + w / 2 + 4, hy - 7); g.lineTo(x0 + w / 2, hy - 2); g.fill();
        g.lineWidth = 1;
      }
    }
  };
  Timeline.prototype.multiStep = function () { if (this._ms === undefined) this._ms = new Set(this.bands.map((b) => b.step)).size > 1; return this._ms; };
  function niceStep(x) { const p = Math.pow(10, Math.floor(Math.log10(Math.max(x, 1)))); const f = x / p; return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p; }

  // ---- the page ----------------------------------------------------------------------------------
  function App(data, root) {
    this.data = data; this.root = root; this.filter = new Filter();
    this.models = data.views.map((v) => new Model(v));
    // ranks: the rank shown beside the lowest; the first that diverges, when one does
    const diverged = ((data.ranks || {}).comparisons || []).find((c) => !c.agree);
    this.current = diverged ? Math.max(0, data.ranks.ranks.indexOf(diverged.rank)) : 0;
    root.replaceChildren();
    this.header = el("header"); root.appendChild(this.header);
    const body = el("div", "body"); root.appendChild(body);
    this.aside = el("aside"); body.appendChild(this.aside);
    this.main = el("main"); body.appendChild(this.main);
    this.footer = el("footer"); root.appendChild(this.footer);
    this.buildHeader();
    this.showPanes();
    if (window.ResizeObserver) new ResizeObserver(() => this.alignHeads()).observe(this.main);
  }
  // panes side by side keep their timelines and trees level when a narrow head wraps
  App.prototype.alignHeads = function () {
    const heads = (this.panes || []).map((p) => p.head);
    for (const h of heads) h.style.minHeight = "";
    if (heads.length < 2) return;
    const tall = Math.max.apply(null, heads.map((h) => h.offsetHeight));
    for (const h of heads) h.style.minHeight = tall + "px";
  };
  App.prototype.buildHeader = function () {
    const d = this.data, m = this.models[0];
    const top = el("div", "top");
    const h1 = el("h1");
    span(h1, "brand", "hooktrace");
    const what = d.mode === "diff" ? "diff" : d.mode === "ranks" ? "ranks" : "";
    span(h1, "", what ? what + " " : "");
    span(h1, "", m ? S(m.meta.target || (d.mode === "trace" ? m.label : "")) : "");
    top.appendChild(h1);
    if (m) {
      const meta = m.meta, bits = [];
      if (meta.torch) bits.push("torch " + S(meta.torch));
      if (meta.device) bits.push(S(meta.device));
      if (meta.steps) bits.push(plural(meta.steps, "step"));
      if (d.mode !== "ranks" && meta.rank !== null && meta.rank !== undefined) bits.push("rank " + meta.rank + " of " + meta.world_size);
      if (meta.created) bits.push(S(meta.created));
      if (m.times && m.n) bits.push(S(m.times));
      span(top, "meta", bits.join(" · "));
      if (m.dryRun) span(top, "dryrun", S(m.dryRun));
    }
    if (d.mode === "ranks") top.appendChild(this.rankSelector());
    this.header.appendChild(top);
    const f = el("div", "filters");
    const search = el("input");
    search.type = "search"; search.placeholder = "search module path or hook name"; search.id = "search";
    search.setAttribute("aria-label", "search module path or hook name");
    let timer = 0;
    search.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { this.filter.text = search.value.trim(); this.applyFilter(); }, 120); });
    f.appendChild(search);
    const kinds = new Set(), phases = new Set(), badges = new Set();
    for (const mm of this.models) {
      for (let e = 0; e < mm.n; e++) { if (mm.type[e] === WORDS.HOOK) kinds.add(mm.kind[e]); phases.add(mm.phase[e]); }
      for (const h of mm.hooks) for (const b of mm.badges(h)) badges.add(b);
      if (mm.returned.some((x) => x)) badges.add(WORDS.badges.returned);
      if (mm.error.some((x, i) => x !== null && mm.type[i] === WORDS.HOOK && !stoppedByPyTorch(x))) badges.add(WORDS.badges.error);
    }
    const mk = (id, label, values, key) => {
      const s = el("select"); s.id = id; s.setAttribute("aria-label", label);
      s.appendChild(new Option("any " + label, ""));
      for (const v of Array.from(values).filter((x) => x !== null).sort()) s.appendChild(new Option(S(v), v));
      s.addEventListener("change", () => { this.filter[key] = s.value; this.applyFilter(); });
      f.appendChild(s);
      return s;
    };
    mk("kind", "kind", kinds, "kind"); mk("phase", "phase", phases, "phase"); mk("badge", "badge", badges, "badge");
    const clear = el("button", "", "clear");
    clear.addEventListener("click", () => {
      search.value = ""; for (const id of ["kind", "phase", "badge"]) document.getElementById(id).value = "";
      this.filter = new Filter(); this.applyFilter();
    });
    f.appendChild(clear);
    this.count = span(f, "count", "");
    this.header.appendChild(f);
  };
  App.prototype.rankSelector = function () {
    const box = el("div", "ranksel");
    span(box, "meta", "rank:");
    const comps = new Map(((this.data.ranks || {}).comparisons || []).map((c) => [c.rank, c]));
    this.rankButtons = this.models.map((mm, k) => {
      const b = el("button", "btn", S(mm.label.replace(/^rank /, "")));
      const c = comps.get((this.data.ranks.ranks || [])[k]);
      if (c && !c.agree) b.classList.add("diverged");
      b.title = c ? (c.agree ? "agrees with rank " + c.reference : "diverges from rank " + c.reference) : "reference rank";
      b.dataset.rank = k;
      b.addEventListener("click", () => { this.current = k; this.showPanes(); });
      box.appendChild(b);
      return b;
    });
    return box;
  };
  App.prototype.showPanes = function () {
    this.main.replaceChildren();
    const idx = this.data.mode === "ranks" ? (this.current ? [0, this.current] : [0]) : this.models.map((_, k) => k);
    this.panes = idx.map((k) => new Pane(this, this.models[k], this.main));
    if (this.rankButtons) this.rankButtons.forEach((b, k) => b.classList.toggle("on", k === this.current));
    this.buildAside();
    this.alignHeads();
    if (this.filter.active()) this.applyFilter();
    const m = this.models[idx[0]];
    const counts = m && idx.length === 1 && m.counts ? S(m.counts) + " · " : "";
    this.footer.textContent = m ? "hooktrace report · " + counts + "click a row or a mark for details; wheel zooms the timeline, drag pans" : "";
  };
  App.prototype.applyFilter = function () {
    let total = 0, all = 0;
    for (const p of this.panes) { total += p.applyFilter(this.filter); all += p.m.hookRows[p.m.nrows]; }
    this.count.textContent = this.filter.active() ? plural(total, "matching hook call") : "";
  };
  App.prototype.buildAside = function () {
    const a = this.aside;
    a.replaceChildren();
    const d = this.data;
    if (d.mode === "diff") a.appendChild(this.diffSection());
    if (d.mode === "ranks") a.appendChild(this.rankSection());
    for (const p of this.panes) a.appendChild(this.surpriseSection(p));
    this.details = el("section", "details");
    this.details.appendChild(el("h2", "", "details"));
    this.details.appendChild(el("div", "none", "Select a hook (a row of the tree or a mark in the timeline) to see where it was registered and how often it fired."));
    a.appendChild(this.details);
  };
  App.prototype.diffSection = function () {
    const s = el("section"), diff = this.data.diff;
    s.appendChild(el("h2", "", "differences"));
    const b = el("div", "banner " + (diff.equal ? "good" : "bad"), diff.equal ? "Same hook order in both traces." : plural(diff.differences.length, "difference") + "; the differing hook calls are marked in red on both sides.");
    s.appendChild(b);
    if (!diff.equal) s.appendChild(el("div", "difftext", SL(diff.summary)));
    return s;
  };
  App.prototype.rankSection = function () {
    const s = el("section"), r = this.data.ranks;
    s.appendChild(el("h2", "", "ranks"));
    const diverged = r.comparisons.filter((c) => !c.agree);
    s.appendChild(el("div", "banner " + (diverged.length ? "bad" : "good"), diverged.length ? plural(diverged.length, "rank") + " diverge" + (diverged.length === 1 ? "s" : "") + " from rank " + r.ranks[0] + "; the first divergence is marked in red." : "All " + plural(r.ranks.length, "rank") + " agree on the hook order."));
    if (r.missing && r.missing.length) s.appendChild(el("div", "banner bad", "No trace for " + (r.missing.length === 1 ? "rank " : "ranks ") + r.missing.join(", ") + "."));
    const rank = r.ranks[this.current];
    const mine = r.comparisons.filter((c) => c.rank === rank || (this.current === 0 && !c.agree));
    for (const c of mine) {
      s.appendChild(el("div", "difftext", SL(c.text)));
      if (c.agree) continue;
      const go = el("button", "btn", "go to the first divergence" + (c.got_seq !== null ? " (#" + c.got_seq + " on rank " + c.rank + ")" : ""));
      go.addEventListener("click", () => {
        const k = r.ranks.indexOf(c.rank);
        if (this.current !== k) { this.current = k; this.showPanes(); }
        for (const p of this.panes) {
          const seq = p.m === this.models[k] ? c.got_seq : c.expected_seq;
          if (seq !== null && seq !== undefined) { p.highlight([seq]); p.selectSeq(seq); }
        }
      });
      s.appendChild(go);
    }
    return s;
  };
  App.prototype.surpriseSection = function (pane) {
    const m = pane.m, s = el("section");
    const h2 = el("h2", "", "surprises");
    if (this.panes.length > 1) span(h2, "name", " · " + S(m.label));  // a name: not upper-cased
    s.appendChild(h2);
    if (!m.surprises.length) { s.appendChild(el("div", "none", "No surprises.")); return s; }
    const warn = m.surprises.filter((x) => (x.level || "warn") !== "info"), info = m.surprises.filter((x) => x.level === "info");
    const add = (host, x) => {
      const box = el("div", "surprise" + (x.level === "info" ? " info" : ""));
      box.setAttribute("role", "button");
      span(box, "rule", S(x.rule));
      box.appendChild(withCode(el("div", "msg"), x.message));
      let seqs = x.events || [];
      if (!seqs.length && x.hooks && x.hooks.length) { for (const id of x.hooks) for (const e of m.firings.get(id) || []) seqs.push(m.seq[e]); }
      if (seqs.length) box.appendChild(el("div", "refs", "events " + seqs.slice(0, 8).map((q) => "#" + q).join(" ") + (seqs.length > 8 ? " (+" + (seqs.length - 8) + ")" : "")));
      box.addEventListener("click", () => {
        for (const o of this.aside.querySelectorAll(".surprise.active")) o.classList.remove("active");
        box.classList.add("active");
        pane.highlight(seqs);
      });
      host.appendChild(box);
    };
    for (const x of warn) add(s, x);
    if (info.length) {
      const det = el("details"); det.appendChild(el("summary", "", plural(info.length, "info surprise")));
      for (const x of info) add(det, x);
      s.appendChild(det);
    }
    return s;
  };
  App.prototype.showDetails = function (pane, i) {
    const m = pane.m, r = m.rows, d = this.details;
    d.replaceChildren(el("h2", "", "details"));
    const table = el("table");
    const row = (k, v, cls) => { const tr = el("tr"); tr.appendChild(el("td", "", k)); const td = el("td", cls || "", v); tr.appendChild(td); table.appendChild(tr); return td; };
    const t = r.type[i];
    if (t === ROW.HOOK) {
      const e = m.ev(r.first[i]);
      const h = e >= 0 ? m.hookOf(e) : null;
      d.appendChild(el("div", "name", h ? S(h.name) : "unknown hook " + (e >= 0 ? m.hook[e] : "")));
      if (h) {
        row("kind", S(h.kind));
        row("scope", S(h.scope));
        if (h.module !== null && h.module !== undefined) row("module", modName(h.module), "where");
        if (h.tensor) row("tensor", S(h.tensor), "where");
        const flags = m.badges(h);
        if (h.removed_during_run) flags.push("removed during run");
        row("flags", flags.length ? flags.join(", ") : "none");
        row("defined_at", S(h.defined_at || "—"), "where");
        row("registered_at", S(h.registered_at || "— (before capture)"), "where");
        row("registered_by", S(h.registered_by || "—"), "where");
        row("handle id", String(h.id));
      }
      if (e >= 0) {
        row("this event", "#" + m.seq[e] + " · step " + m.step[e] + " · " + S(m.phase[e]) + " · for " + modName(m.module[e]));
        const lane = pane.timeline ? pane.timeline.lanes.findIndex((l) => l.thread === m.thread[e]) + 1 : 0;
        row("thread", (lane ? "thread " + lane + " of the timeline · " : "") + "ident " + String(m.threadIdent[e]));
        row("duration", fmtNs(m.dur[e] || 0));
        if (m.shapes[e] !== null && m.shapes[e] !== undefined) row("shapes", S(m.shapes[e]), "shapes");
        if (m.returned[e]) row("returned", "yes: its value replaced what PyTorch passed");
        if (m.error[e] !== null && m.error[e] !== undefined) row("error", S(m.error[e]), "where");
        const fired = m.firings.get(m.hook[e]) || [];
        const where = new Map();
        for (const x of fired) { const key = "step " + m.step[x] + " · " + S(m.phase[x]) + " · " + modName(m.module[x]); where.set(key, (where.get(key) || 0) + 1); }
        const td = row("fired", plural(fired.length, "time"));
        const list = el("div", "where");
        let shown = 0;
        for (const [key, n] of where) {
          if (shown++ >= 12) { list.appendChild(el("div", "dim", "… " + (where.size - 12) + " more places")); break; }
          list.appendChild(el("div", "", key + (n > 1 ? " ×" + n : "")));
        }
        td.appendChild(list);
        const links = el("div", "where");
        for (const x of fired.slice(0, 40)) {
          const a = span(links, "link", "#" + m.seq[x]);
          a.addEventListener("click", () => pane.selectSeq(m.seq[x]));
          links.appendChild(document.createTextNode(" "));
        }
        if (fired.length > 40) span(links, "dim", "…");
        td.appendChild(links);
      }
    } else {
      const mod = m.rowModule(i);
      const names = ["step", "phase", "module call", "hook group", "hook", "saved tensors", "repeated siblings", "compiled graph run"];
      d.appendChild(el("div", "name", t === ROW.STEP ? "step " + r.extra[i] : t === ROW.PHASE ? S(m.strings[r.extra[i]]) : modName(mod)));
      row("what", names[t]);
      if (mod !== null && m.types.get(mod)) row("type", S(m.types.get(mod)));
      row("events", "#" + r.first[i] + "–#" + r.last[i]);
      row("hook calls", String(m.hookRows[r.end[i]] - m.hookRows[i]));
      if (r.errors[i] !== undefined) row("error", S(r.errors[i]), "where");
    }
    d.appendChild(table);
  };

  function main() {
    const root = document.getElementById("app");
    try {
      const t0 = performance.now();
      const data = JSON.parse(document.getElementById("hooktrace-data").textContent);
      if (data.unsafe) UNSAFE = new RegExp(data.unsafe, "gu");
      WORDS = new Words(data.words);
      const t1 = performance.now();
      window.hooktraceReport = new App(data, root);
      window.hooktraceTimings = { parse_ms: t1 - t0, build_ms: performance.now() - t1, ready_ms: performance.now() };
    } catch (err) {
      root.replaceChildren(el("p", "loading", "This report could not be shown: " + S(err && err.message)));
      throw err;
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", main); else main();
})();
