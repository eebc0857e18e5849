// markdown.js - a reply's text to HTML that is safe to insert: Markdown
// (marked), math (KaTeX: $…$, $$…$$, \(…\), \[…\]) and code highlighting
// (highlight.js), then sanitized (DOMPurify), all from Debian's packages,
// embedded in the binary. A model's text is untrusted: without DOMPurify no
// HTML is made at all and the text is shown as it is (escaped), and each of
// the other libraries, when absent, only leaves its part unformatted.
'use strict';

window.kvcMarkdown = (() => {
  const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) =>
    ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
  const plain = (text) => '<p class="plain">' + escapeHtml(text) + '</p>';

  // Debian 12's node-dompurify (2.4.1+dfsg-2+deb12u1) has sanitize() read a
  // `shadowNode` it never declares (a slip of the backported nesting-depth
  // fix), so every call with markup throws a ReferenceError. Upstream has no
  // such check at that point; a global of that name at depth 0 makes it a
  // no-op, and the per-node depth checks that follow work as upstream's.
  if (!('shadowNode' in window)) window.shadowNode = { __depth: 0 };

  const hasMarked = typeof marked !== 'undefined' && typeof marked.parse === 'function';
  const hasPurify = typeof DOMPurify !== 'undefined' && DOMPurify.isSupported;
  const hasHljs = typeof hljs !== 'undefined';
  const hasKatex = typeof katex !== 'undefined';

  function tex(src, display) {
    try {
      return katex.renderToString(src, { displayMode: display, throwOnError: false });
    } catch (e) {
      return '<code>' + escapeHtml(src) + '</code>';
    }
  }

  // $…$ is math only when it looks like it: no space inside either dollar
  // and no digit right after the closing one ("costs $5 and $6" stays text).
  const mathBlock = {
    name: 'mathBlock', level: 'block',
    start(src) { const i = src.search(/\$\$|\\\[/); return i < 0 ? undefined : i; },
    tokenizer(src) {
      const m = /^(?:\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\])[ \t]*(?:\n|$)/.exec(src);
      if (m) return { type: 'mathBlock', raw: m[0], text: (m[1] || m[2]).trim() };
      return undefined;
    },
    renderer(t) { return '<div class="math-block">' + tex(t.text, true) + '</div>'; },
  };
  const mathInline = {
    name: 'mathInline', level: 'inline',
    start(src) { const i = src.search(/\$|\\\(/); return i < 0 ? undefined : i; },
    tokenizer(src) {
      let m = /^\$\$([^$]+?)\$\$/.exec(src);
      if (m) return { type: 'mathInline', raw: m[0], text: m[1], display: true };
      m = /^\\\(([\s\S]+?)\\\)/.exec(src) || /^\$(?![\s$])((?:\\.|[^\\$\n])+?)(?<!\s)\$(?!\d)/.exec(src);
      if (m) return { type: 'mathInline', raw: m[0], text: m[1], display: false };
      return undefined;
    },
    renderer(t) { return tex(t.text, t.display); },
  };

  // highlight.js 9 (Debian 12) takes (language, code, ignoreIllegals); 10 and
  // 11 still accept that form.
  function highlight(code, lang) {
    if (!hasHljs || !lang || !hljs.getLanguage(lang)) return null;   // marked escapes it
    try {
      return hljs.highlight(lang, code, true).value;
    } catch (e) {
      return null;
    }
  }

  if (hasMarked && hasPurify) {
    marked.use({
      gfm: true,
      langPrefix: 'hljs language-',
      highlight,
      extensions: hasKatex ? [mathBlock, mathInline] : [],
    });
    // links open elsewhere, and tell nothing of the page
    DOMPurify.addHook('afterSanitizeAttributes', (node) => {
      if (node.tagName === 'A' && node.getAttribute('href')) {
        node.setAttribute('target', '_blank');
        node.setAttribute('rel', 'noopener noreferrer');
      }
    });
  }

  return {
    escapeHtml,
    // HTML for Markdown text: sanitized, or the text escaped.
    render(text) {
      if (!text) return '';
      if (!hasMarked || !hasPurify) return plain(text);
      try {
        return DOMPurify.sanitize(marked.parse(text), { FORBID_TAGS: ['style', 'form', 'input'] });
      } catch (e) {
        return plain(text);
      }
    },
    libraries: { marked: hasMarked, dompurify: hasPurify, highlight: hasHljs, katex: hasKatex },
  };
})();
