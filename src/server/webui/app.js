// app.js - the chat page of `kvchat serve`: conversations kept in this
// browser (localStorage), replies streamed from POST /v1/chat/completions
// (SSE), stop, regenerate, edit any earlier message (a new branch: the old one
// stays, reachable with ‹ ›), the system prompt and sampling settings, reasoning
// shown folded, tool calls shown, and per reply the figures that are kvchat's
// point: prompt tokens, cached (RAM / disk), computed, time to first token,
// tokens/s. An edit or a regeneration sends the conversation up to that
// point: the server finds its prefix in the cache and computes only what
// follows the change.
//
// A conversation is a tree of messages (each names its parent), and `leaf`
// says which branch is shown: the path from the root to the leaf is the
// conversation sent. Nothing here is a secret of the page: the API key is
// asked for in Settings when the server wants one.
'use strict';

(() => {
  // ======================================================== storage
  const KEY_SETTINGS = 'kvchat.settings', KEY_INDEX = 'kvchat.index', KEY_CONV = 'kvchat.conv.';
  const DEFAULTS = { apiKey: '', system: '', temperature: '', topP: '', maxTokens: '', seed: '',
                     showReasoning: false };

  function load(key, fallback) {
    try {
      const v = localStorage.getItem(key);
      return v === null ? fallback : JSON.parse(v);
    } catch (e) {
      return fallback;
    }
  }
  function store(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
      return true;
    } catch (e) {   // full, or storage off: the page goes on, unsaved
      toast('Could not save in this browser: ' + e.message);
      return false;
    }
  }
  const newId = () => (window.crypto && crypto.randomUUID) ? crypto.randomUUID()
    : Date.now().toString(36) + Math.random().toString(36).slice(2, 12);

  const S = {
    settings: Object.assign({}, DEFAULTS, load(KEY_SETTINGS, {})),
    index: load(KEY_INDEX, []),     // [{ id, title, updated }], newest first
    conv: null,                     // the conversation shown
    busy: null,                     // { conv, nodeId, controller } while a reply streams
    model: null,                    // the served model's id (/v1/models)
    editing: null,                  // the id of the message being edited
  };

  function loadConv(id) {
    if (S.busy && S.busy.conv.id === id) return S.busy.conv;
    const c = load(KEY_CONV + id, null);
    if (!c || !c.nodes) return null;
    for (const n of Object.values(c.nodes))   // the page was left while it streamed
      if (n.pending) {
        n.pending = false;
        n.stopped = true;
      }
    return c;
  }
  function saveConv(c) {
    if (c.deleted) return;
    c.updated = Date.now();
    store(KEY_CONV + c.id, c);
    const entry = { id: c.id, title: c.title, updated: c.updated };
    S.index = [entry].concat(S.index.filter((e) => e.id !== c.id));
    store(KEY_INDEX, S.index);
    renderSidebar();
  }
  function deleteConv(id) {
    if (S.busy && S.busy.conv.id === id) {   // its reply would save it again
      S.busy.conv.deleted = true;
      stop();
    }
    localStorage.removeItem(KEY_CONV + id);
    S.index = S.index.filter((e) => e.id !== id);
    store(KEY_INDEX, S.index);
    if (S.conv && S.conv.id === id) S.conv = null;
    renderAll();
  }

  // ======================================================== the tree
  function newConv() {
    return { id: newId(), title: 'New chat', created: Date.now(), updated: Date.now(),
             nodes: {}, roots: [], leaf: null };
  }
  function addNode(c, parent, fields) {
    const n = Object.assign({ id: newId(), parent, role: 'user', content: '', time: Date.now() },
                            fields);
    c.nodes[n.id] = n;
    (parent ? c.nodes[parent].children || (c.nodes[parent].children = []) : c.roots).push(n.id);
    if (c.title === 'New chat' && n.role === 'user')
      c.title = n.content.replace(/\s+/g, ' ').trim().slice(0, 60) || 'New chat';
    return n;
  }
  function removeNode(c, id) {   // a leaf only (a failed reply)
    const n = c.nodes[id];
    const list = n.parent ? c.nodes[n.parent].children : c.roots;
    list.splice(list.indexOf(id), 1);
    delete c.nodes[id];
    if (c.leaf === id) c.leaf = n.parent;
  }
  function pathTo(c, id) {
    const path = [];
    for (let n = id && c.nodes[id]; n; n = n.parent && c.nodes[n.parent]) path.unshift(n);
    return path;
  }
  const siblingsOf = (c, n) => (n.parent ? c.nodes[n.parent].children : c.roots);
  // the leaf a branch leads to: its newest child, all the way down
  function lastLeaf(c, id) {
    let n = c.nodes[id];
    while (n.children && n.children.length) n = c.nodes[n.children[n.children.length - 1]];
    return n.id;
  }

  // ======================================================== the API
  function apiHeaders(json) {
    const h = {};
    if (json) h['Content-Type'] = 'application/json';
    if (S.settings.apiKey) h.Authorization = 'Bearer ' + S.settings.apiKey;
    return h;
  }
  const num = (v) => (v === '' || v === null || v === undefined || isNaN(Number(v)) ? undefined
                                                                                     : Number(v));

  // The messages of the path that ends at `id`, the system prompt first. A
  // failed reply that has no text is left out.
  function buildMessages(c, id) {
    const msgs = [];
    if (S.settings.system.trim()) msgs.push({ role: 'system', content: S.settings.system });
    for (const n of pathTo(c, id)) {
      if (n.role === 'assistant' && !n.content && (n.error || n.stopped)) continue;
      msgs.push({ role: n.role, content: n.content });
    }
    return msgs;
  }

  function requestBody(c, parentId) {
    const b = { messages: buildMessages(c, parentId), stream: true,
                stream_options: { include_usage: true }, prompt_cache_key: c.id };
    if (S.model) b.model = S.model;
    const t = num(S.settings.temperature), p = num(S.settings.topP),
          m = num(S.settings.maxTokens), seed = num(S.settings.seed);
    if (t !== undefined) b.temperature = t;
    if (p !== undefined) b.top_p = p;
    if (m !== undefined && m > 0) b.max_tokens = Math.floor(m);
    if (seed !== undefined) b.seed = Math.floor(seed);
    return b;
  }

  // An error answer (JSON in OpenAI's shape, or anything else) as { status, message, code }.
  async function errorOf(res) {
    let text = '';
    try { text = await res.text(); } catch (e) { /* the body is lost: the status says it */ }
    let err = null;
    try { err = JSON.parse(text).error; } catch (e) { /* not JSON */ }
    const message = (err && (err.message || err)) || text || res.statusText || 'error';
    return { status: res.status, message: String(message), code: err && err.code };
  }

  // Stream a reply as a new assistant message under parentId.
  async function generate(c, parentId) {
    const node = addNode(c, parentId, { role: 'assistant', pending: true, reasoning: '' });
    c.leaf = node.id;
    const controller = new AbortController();
    S.busy = { conv: c, nodeId: node.id, controller };
    saveConv(c);
    renderAll();
    setBusy(true);
    const t0 = performance.now();
    try {
      const res = await fetch('/v1/chat/completions', {
        method: 'POST', headers: apiHeaders(true), body: JSON.stringify(requestBody(c, parentId)),
        signal: controller.signal });
      if (!res.ok) node.error = await errorOf(res);
      else await readStream(res, c, node, t0);
    } catch (e) {
      if (e.name === 'AbortError') node.stopped = true;
      else node.error = { status: 0, message: 'Cannot reach the server: ' + e.message };
    }
    node.pending = false;
    node.clientMs = performance.now() - t0;
    S.busy = null;
    setBusy(false);
    saveConv(c);
    if (S.conv === c) renderMessages();
    if (node.error && node.error.status === 401) openSettings(true);
  }

  // Read the SSE stream of a chat completion into node.
  async function readStream(res, c, node, t0) {
    const reader = res.body.getReader(), dec = new TextDecoder();
    let buf = '', done = false;
    const onData = (data) => {
      if (data === '[DONE]') { done = true; return; }
      let o;
      try { o = JSON.parse(data); } catch (e) { return; }
      if (o.error) {
        node.error = { status: 0, message: String(o.error.message || o.error), code: o.error.code };
        return;
      }
      const ch = o.choices && o.choices[0];
      if (ch) {
        const d = ch.delta || {};
        if (d.content) node.content += d.content;
        if (d.reasoning_content) node.reasoning += d.reasoning_content;
        if (d.tool_calls) mergeToolCalls(node, d.tool_calls);
        if ((d.content || d.reasoning_content || d.tool_calls) && node.firstMs === undefined)
          node.firstMs = performance.now() - t0;
        if (ch.finish_reason) node.finish = ch.finish_reason;
      }
      if (o.usage || o.timings) node.stats = statsOf(o.usage, o.timings);
      scheduleStreamRender(c, node);
    };
    while (!done) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i).replace(/\r$/, '');
        buf = buf.slice(i + 1);
        if (line.startsWith('data:')) onData(line.slice(5).trim());
      }
    }
  }

  function mergeToolCalls(node, deltas) {
    node.toolCalls = node.toolCalls || [];
    for (const d of deltas) {
      const i = d.index !== undefined ? d.index : node.toolCalls.length;
      const t = node.toolCalls[i] || (node.toolCalls[i] = { name: '', arguments: '' });
      if (d.function && d.function.name) t.name += d.function.name;
      if (d.function && d.function.arguments) t.arguments += d.function.arguments;
    }
  }

  // The figures of one reply, from usage and llama-server's timings object.
  function statsOf(u, t) {
    u = u || {};
    t = t || {};
    const det = u.prompt_tokens_details || {};
    const cached = det.cached_tokens !== undefined ? det.cached_tokens : t.cache_n;
    const disk = det.cached_disk_tokens !== undefined ? det.cached_disk_tokens : t.cache_disk_n;
    return {
      prompt: u.prompt_tokens,
      cached: cached || 0,
      disk: disk || 0,
      computed: t.prompt_n !== undefined ? t.prompt_n : (u.prompt_tokens || 0) - (cached || 0),
      output: u.completion_tokens !== undefined ? u.completion_tokens : t.predicted_n,
      ttftMs: t.ttft_ms,
      promptMs: t.prompt_ms,
      tps: t.predicted_per_second,
    };
  }

  async function fetchModel() {
    try {
      const res = await fetch('/v1/models', { headers: apiHeaders(false) });
      if (res.status === 401) {
        $('model-name').textContent = 'API key needed';
        openSettings(true);
        return;
      }
      const j = await res.json();
      const m = j.data && j.data[0];
      if (!m) return;
      S.model = m.id;
      $('model-name').textContent = m.id;
      const meta = m.meta || {};
      let ctx = m.context_length || m.max_model_len || meta.n_ctx || meta.context_length;
      if (!ctx) {
        const p = await fetch('/props', { headers: apiHeaders(false) });
        if (p.ok) {
          const props = await p.json();
          ctx = (props.default_generation_settings || {}).n_ctx || props.n_ctx;
        }
      }
      $('model-ctx').textContent = ctx ? 'context ' + ctx.toLocaleString() + ' tokens' : '';
    } catch (e) {
      $('model-name').textContent = 'server unreachable';
    }
  }

  // ======================================================== actions
  async function send(text) {
    if (S.busy || !text.trim()) return;
    let c = S.conv;
    if (!c) {
      c = S.conv = newConv();
    }
    // a reply that failed without text is dropped: the new message replaces it
    const leaf = c.leaf && c.nodes[c.leaf];
    if (leaf && leaf.role === 'assistant' && !leaf.content && (leaf.error || leaf.stopped))
      removeNode(c, leaf.id);
    const u = addNode(c, c.leaf, { role: 'user', content: text });
    c.leaf = u.id;
    await generate(c, u.id);
  }

  async function regenerate(id) {
    const c = S.conv, n = c.nodes[id];
    if (S.busy || !n) return;
    if (n.role === 'assistant' && !n.content && (n.error || n.stopped)) removeNode(c, id);
    await generate(c, n.parent);
  }

  // An edited message is a new sibling: the old branch stays. A user
  // message's edit asks for a new reply; an assistant's is only kept.
  async function saveEdit(id, text) {
    const c = S.conv, n = c.nodes[id];
    S.editing = null;
    if (!n || S.busy) return renderMessages();
    if (text === n.content) return renderMessages();
    const e = addNode(c, n.parent, { role: n.role, content: text, edited: true,
                                     reasoning: n.role === 'assistant' ? '' : undefined });
    c.leaf = e.id;
    if (n.role === 'user') return generate(c, e.id);
    saveConv(c);
    renderMessages();
  }

  function switchBranch(id, step) {
    const c = S.conv, sib = siblingsOf(c, c.nodes[id]);
    const j = sib.indexOf(id) + step;
    if (S.busy || j < 0 || j >= sib.length) return;
    c.leaf = lastLeaf(c, sib[j]);
    saveConv(c);
    renderMessages();
  }

  function stop() {
    if (S.busy) S.busy.controller.abort();
  }

  // ======================================================== rendering
  const $ = (id) => document.getElementById(id);
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function button(label, title, onclick, cls) {
    const b = el('button', cls || 'icon', label);
    b.type = 'button';
    b.title = title;
    b.setAttribute('aria-label', title);
    b.addEventListener('click', onclick);
    return b;
  }

  let toastTimer = 0;
  function toast(text) {
    let t = $('toast');
    if (!t) {
      t = el('div');
      t.id = 'toast';
      document.body.appendChild(t);
    }
    t.textContent = text;
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { t.hidden = true; }, 4000);
  }

  function renderSidebar() {
    const nav = $('conversations');
    nav.replaceChildren();
    for (const e of S.index) {
      const row = el('div', 'conv' + (S.conv && S.conv.id === e.id ? ' active' : ''));
      const a = el('a', 'conv-title', e.title);
      a.href = '#' + e.id;
      a.title = e.title;
      row.appendChild(a);
      row.appendChild(button('×', 'Delete this conversation', () => {
        if (confirm('Delete "' + e.title + '"?')) deleteConv(e.id);
      }, 'icon del'));
      nav.appendChild(row);
    }
  }

  const fmtMs = (ms) => (ms >= 1000 ? (ms / 1000).toFixed(2) + ' s' : Math.round(ms) + ' ms');

  // The figures of a reply: text, a bar of cached (RAM, disk) and computed
  // prompt tokens, and data-* attributes with the numbers.
  function statsEl(n) {
    const box = el('div', 'stats');
    const st = n.stats;
    if (!st || st.prompt === undefined) {
      if (n.stopped) box.appendChild(el('span', 'muted', 'stopped'));
      if (n.firstMs !== undefined)
        box.appendChild(el('span', 'muted', 'first token after ' + fmtMs(n.firstMs)));
      return box;
    }
    for (const k of ['prompt', 'cached', 'disk', 'computed', 'output'])
      box.dataset[k] = st[k] === undefined ? '' : String(st[k]);
    const ram = st.cached - st.disk;
    const bar = el('span', 'bar');
    bar.title = `${st.cached} of ${st.prompt} prompt tokens from the cache (RAM ${ram}, disk ${st.disk}), ${st.computed} computed`;
    const seg = (cls, v) => {
      const s = el('span', cls);
      s.style.flexGrow = String(v);
      bar.appendChild(s);
    };
    seg('ram', ram);
    seg('disk', st.disk);
    seg('computed', st.computed);
    box.appendChild(bar);
    const parts = [
      ['prompt', `${st.prompt} prompt`],
      ['cached', `${st.cached} cached` + (st.cached ? ` (RAM ${ram} · disk ${st.disk})` : '')],
      ['computed', `${st.computed} computed`],
    ];
    if (st.ttftMs !== undefined) parts.push(['ttft', 'TTFT ' + fmtMs(st.ttftMs)]);
    if (st.output !== undefined) parts.push(['output', `${st.output} tokens`]);
    if (st.tps) parts.push(['tps', st.tps.toFixed(1) + ' tok/s']);
    if (n.finish === 'length') parts.push(['finish', 'cut at max tokens']);
    if (n.stopped) parts.push(['finish', 'stopped']);
    for (const [cls, text] of parts) box.appendChild(el('span', 'fig ' + cls, text));
    return box;
  }

  function errorEl(err) {
    const box = el('div', 'error-box');
    box.setAttribute('role', 'alert');
    let text = err.message;
    if (err.status === 401) text = 'This server needs an API key: set it in Settings, then Regenerate.';
    else if (err.code === 'context_length_exceeded')
      text = err.message + ' — shorten the conversation (edit an earlier message, or start a new ' +
             'chat) or lower Max tokens in Settings.';
    box.appendChild(el('strong', null, err.status ? `Error ${err.status}` : 'Error'));
    box.appendChild(el('span', null, ' ' + text));
    if (err.status === 401) box.appendChild(button('Settings', 'Open settings', () => openSettings(true), 'link'));
    return box;
  }

  function copyText(text) {
    if (!navigator.clipboard) toast('Copying needs https or localhost');   // a secure context
    else navigator.clipboard.writeText(text).then(() => toast('Copied'));
  }

  // A Copy button on each code block of a rendered message.
  function addCodeCopy(body) {
    for (const pre of body.querySelectorAll('pre')) {
      const code = pre.querySelector('code') || pre;
      pre.appendChild(button('Copy', 'Copy the code', () => copyText(code.textContent), 'code-copy'));
    }
  }

  // The inside of a message's bubble (re-made while its reply streams).
  function fillBubble(bubble, n) {
    const was = bubble.querySelector('details.reasoning[data-manual]');   // opened or closed by hand
    bubble.replaceChildren();
    if (n.role === 'assistant' && n.reasoning) {
      const d = el('details', 'reasoning');
      const thinking = n.pending && !n.content;
      d.open = was ? was.open : thinking && S.settings.showReasoning;   // folded once the answer comes
      if (was) d.dataset.manual = '1';
      const sum = el('summary', null, thinking ? 'Reasoning…' : `Reasoning (${n.reasoning.length} characters)`);
      sum.addEventListener('click', () => { d.dataset.manual = '1'; });
      d.appendChild(sum);
      const body = el('div', 'reasoning-body markdown');
      body.innerHTML = kvcMarkdown.render(n.reasoning);
      d.appendChild(body);
      bubble.appendChild(d);
    }
    if (n.role === 'user') {
      bubble.appendChild(el('div', 'content user-text', n.content));
    } else {
      const body = el('div', 'content markdown');
      body.innerHTML = kvcMarkdown.render(n.content);
      addCodeCopy(body);
      if (n.pending) {
        body.classList.add('streaming');
        if (!n.content && !n.reasoning) body.appendChild(el('span', 'typing', '…'));
      }
      bubble.appendChild(body);
    }
    if (n.toolCalls && n.toolCalls.length) {
      const box = el('div', 'tool-calls');
      for (const t of n.toolCalls) {
        const call = el('div', 'tool-call');
        call.appendChild(el('span', 'tool-label', 'tool call'));
        call.appendChild(el('code', 'tool-name', t.name));
        call.appendChild(el('pre', null, t.arguments));
        box.appendChild(call);
      }
      bubble.appendChild(box);
    }
    if (n.error) bubble.appendChild(errorEl(n.error));
  }

  function messageEl(c, n) {
    const art = el('article', 'msg ' + n.role);
    art.dataset.id = n.id;
    art.dataset.role = n.role;
    if (n.pending) art.classList.add('pending');
    const bubble = el('div', 'bubble');
    if (S.editing === n.id) {
      bubble.appendChild(editorEl(n));
      art.appendChild(bubble);
      return art;
    }
    fillBubble(bubble, n);
    art.appendChild(bubble);

    const meta = el('div', 'meta');
    const sib = siblingsOf(c, n);
    if (sib.length > 1) {
      const i = sib.indexOf(n.id);
      const nav = el('span', 'branch');
      const prev = button('‹', 'Previous version', () => switchBranch(n.id, -1), 'icon prev');
      const next = button('›', 'Next version', () => switchBranch(n.id, 1), 'icon next');
      prev.disabled = i === 0;
      next.disabled = i === sib.length - 1;
      nav.append(prev, el('span', 'branch-pos', `${i + 1}/${sib.length}`), next);
      meta.appendChild(nav);
    }
    if (!S.busy) {   // an edit or a regeneration waits for the reply streaming
      meta.appendChild(button('Edit', 'Edit this message', () => {
        S.editing = n.id;
        renderMessages();
      }, 'act edit'));
      if (n.role === 'assistant')
        meta.appendChild(button('Regenerate', 'Generate this reply again', () => regenerate(n.id),
                                'act regen'));
      if (n.content)
        meta.appendChild(button('Copy', 'Copy the text', () => copyText(n.content), 'act copy'));
    }
    if (n.role === 'assistant') art.appendChild(statsEl(n));
    art.appendChild(meta);
    return art;
  }

  function editorEl(n) {
    const f = el('form', 'editor');
    const ta = el('textarea');
    ta.value = n.content;
    ta.rows = Math.min(16, Math.max(3, n.content.split('\n').length + 1));
    const ok = el('button', 'primary', n.role === 'user' ? 'Send' : 'Save');
    ok.type = 'submit';
    const cancel = button('Cancel', 'Cancel the edit', () => {
      S.editing = null;
      renderMessages();
    }, 'act');
    f.append(ta, el('div', 'editor-buttons'));
    f.lastChild.append(cancel, ok);
    f.addEventListener('submit', (ev) => {
      ev.preventDefault();
      saveEdit(n.id, ta.value);
    });
    ta.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        f.requestSubmit();
      } else if (ev.key === 'Escape') {
        S.editing = null;
        renderMessages();
      }
    });
    setTimeout(() => { ta.focus(); ta.setSelectionRange(ta.value.length, ta.value.length); }, 0);
    return f;
  }

  function nearBottom() {
    const m = $('messages');
    return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
  }
  function scrollDown() {
    const m = $('messages');
    m.scrollTop = m.scrollHeight;
  }

  function renderMessages() {
    const box = $('messages'), c = S.conv;
    const path = c ? pathTo(c, c.leaf) : [];
    const stick = nearBottom();
    box.replaceChildren();
    if (!path.length) box.appendChild(emptyEl);
    for (const n of path) box.appendChild(messageEl(c, n));
    renderTotals();
    if (stick || S.busy) scrollDown();
  }

  // This conversation's figures: the prompt tokens of its replies, how many
  // came from the cache.
  function renderTotals() {
    const t = $('totals'), c = S.conv;
    let prompt = 0, cached = 0, n = 0;
    for (const node of c ? Object.values(c.nodes) : [])
      if (node.stats && node.stats.prompt !== undefined) {
        prompt += node.stats.prompt;
        cached += node.stats.cached;
        n++;
      }
    t.textContent = n ? `${n} repl${n === 1 ? 'y' : 'ies'} · ${cached} of ${prompt} prompt tokens cached` +
                        ` (${Math.round((100 * cached) / Math.max(1, prompt))}%)` : '';
    t.dataset.prompt = String(prompt);
    t.dataset.cached = String(cached);
  }

  let frame = 0;
  function scheduleStreamRender(c, n) {
    if (frame || S.conv !== c) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      const art = document.querySelector(`article[data-id="${n.id}"]`);
      if (!art) return;
      const stick = nearBottom();
      fillBubble(art.querySelector('.bubble'), n);
      const old = art.querySelector('.stats');
      if (old) old.replaceWith(statsEl(n));
      if (stick) scrollDown();
    });
  }

  function renderAll() {
    renderSidebar();
    renderMessages();
  }

  function setBusy(on) {
    $('send').hidden = on;
    $('stop').hidden = !on;
    document.body.classList.toggle('busy', on);
  }

  // ======================================================== settings
  function openSettings(keyNeeded) {
    const d = $('settings'), s = S.settings;
    $('key-needed').hidden = !keyNeeded;
    $('set-api-key').value = s.apiKey;
    $('set-system').value = s.system;
    $('set-temperature').value = s.temperature;
    $('set-top-p').value = s.topP;
    $('set-max-tokens').value = s.maxTokens;
    $('set-seed').value = s.seed;
    $('set-show-reasoning').checked = s.showReasoning;
    if (!d.open) d.showModal();
    (keyNeeded ? $('set-api-key') : $('set-system')).focus();
  }
  function saveSettings() {
    const keyBefore = S.settings.apiKey;
    S.settings = {
      apiKey: $('set-api-key').value.trim(),
      system: $('set-system').value,
      temperature: $('set-temperature').value,
      topP: $('set-top-p').value,
      maxTokens: $('set-max-tokens').value,
      seed: $('set-seed').value,
      showReasoning: $('set-show-reasoning').checked,
    };
    store(KEY_SETTINGS, S.settings);
    if (S.settings.apiKey !== keyBefore) fetchModel();
  }

  // ======================================================== wiring
  const emptyEl = document.getElementById('empty');

  // Show conversation id (null: a new one). A reply streaming into another
  // conversation goes on, and is there when it is shown again.
  function showConv(id) {
    S.conv = id ? loadConv(id) : null;
    S.editing = null;
    if (id && !S.conv) history.replaceState(null, '', '#');
    renderAll();
    document.body.classList.remove('sidebar-open');
  }

  function autosize(ta) {
    ta.style.height = 'auto';
    ta.style.height = Math.min(ta.scrollHeight + 2, 240) + 'px';
    ta.style.overflowY = ta.scrollHeight > 240 ? 'auto' : 'hidden';
  }

  function init() {
    const input = $('input');
    $('composer').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const text = input.value;
      if (!text.trim() || S.busy) return;
      input.value = '';
      autosize(input);
      send(text);
      if (S.conv) history.replaceState(null, '', '#' + S.conv.id);
    });
    input.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        $('composer').requestSubmit();
      }
    });
    input.addEventListener('input', () => autosize(input));
    $('stop').addEventListener('click', stop);
    $('new-chat').addEventListener('click', () => {
      history.replaceState(null, '', '#');
      showConv(null);
      input.focus();
    });
    $('open-settings').addEventListener('click', () => openSettings(false));
    $('settings-cancel').addEventListener('click', () => $('settings').close());
    // back to the message box once the dialog is gone (Chromium gives the
    // focus back to it, but typing goes nowhere until it is focused anew)
    $('settings').addEventListener('close', () => setTimeout(() => {
      input.blur();
      input.focus();
    }, 0));
    $('settings-form').addEventListener('submit', (ev) => {
      if (ev.submitter && ev.submitter.value === 'save') saveSettings();
    });
    $('clear-all').addEventListener('click', () => {
      if (!confirm('Delete every conversation kept in this browser?')) return;
      for (const e of S.index) localStorage.removeItem(KEY_CONV + e.id);
      S.index = [];
      store(KEY_INDEX, S.index);
      S.conv = null;
      $('settings').close();
      renderAll();
    });
    $('toggle-sidebar').addEventListener('click', () => document.body.classList.toggle('sidebar-open'));
    $('conversations').addEventListener('click', (ev) => {
      const a = ev.target.closest('a.conv-title');
      if (!a) return;
      ev.preventDefault();
      history.replaceState(null, '', a.getAttribute('href'));
      showConv(a.getAttribute('href').slice(1));
    });
    window.addEventListener('hashchange', () => showConv(location.hash.slice(1) || null));
    document.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape' && S.busy) stop();
      if (ev.ctrlKey && ev.shiftKey && (ev.key === 'O' || ev.key === 'o')) {
        ev.preventDefault();
        $('new-chat').click();
      }
    });
    window.addEventListener('storage', (ev) => {   // another tab changed the list
      if (ev.key === KEY_INDEX) {
        S.index = load(KEY_INDEX, []);
        renderSidebar();
      }
    });

    const id = location.hash.slice(1);
    showConv(id && loadConv(id) ? id : null);
    fetchModel();
    input.focus();
  }

  // for the browser test (tests/webui): read-only views of the state
  window.kvchatPage = {
    busy: () => !!S.busy,
    conversation: () => S.conv && JSON.parse(JSON.stringify(S.conv)),
  };

  init();
})();
