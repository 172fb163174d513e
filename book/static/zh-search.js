// The search page, in two parts (see book/zh_search.py).
// 1. Split a search query into the words of the search index. Runs of Han characters are cut greedily into the
//    longest index terms; characters that start no term are dropped (the index keeps no one-character words).
//    Everything else is split as Sphinx does by default.
// 2. Result snippets in plain text: Sphinx cuts them from the page's HTML, where math is still TeX source
//    (MathJax draws it only on the page itself). Each math element becomes a readable approximation, T or
//    p_i = exp(z_i) / Σ_j exp(z_j), and runs of white space become one space.
(() => {
  const HAN_OR_OTHER = /\p{Script=Han}+|[^\p{Script=Han}]+/gu;
  const HAN = /^\p{Script=Han}/u;
  const sphinxSplit = (text) =>
    text.split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu).filter((term) => term);

  let known = null;  // {has(term), longest}
  const indexTerms = () => {
    if (known !== null) return known;
    const index = typeof Search !== "undefined" ? Search._index : null;
    if (!index) return { has: () => false, longest: 0 };
    const terms = new Set([...Object.keys(index.terms || {}), ...Object.keys(index.titleterms || {})]);
    let longest = 0;
    terms.forEach((term) => { longest = Math.max(longest, term.length); });
    known = { has: (term) => terms.has(term), longest };
    return known;
  };

  const segmentHan = (run) => {
    const { has, longest } = indexTerms();
    const words = [];
    let start = 0;
    while (start < run.length) {
      let end = Math.min(run.length, start + longest);
      while (end > start + 1 && !has(run.slice(start, end))) end -= 1;
      if (end > start + 1) {
        words.push(run.slice(start, end));
        start = end;
      } else {
        start += 1;
      }
    }
    return words.length > 0 ? words : [run];  // a word the index lacks still finds nothing, as it should
  };

  window.splitQuery = (query) =>
    (query.match(HAN_OR_OTHER) || []).flatMap((part) => (HAN.test(part) ? segmentHan(part) : sphinxSplit(part)));
})();

(() => {
  const SYMBOLS = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", theta: "θ", lambda: "λ",
    mu: "μ", pi: "π", rho: "ρ", sigma: "σ", tau: "τ", phi: "φ", varphi: "φ", omega: "ω", Delta: "Δ", Sigma: "Σ",
    Pi: "Π", Omega: "Ω", sum: "Σ", prod: "Π", infty: "∞", le: "≤", leq: "≤", ge: "≥", geq: "≥", neq: "≠", ne: "≠",
    approx: "≈", cdot: "·", times: "×", to: "→", rightarrow: "→", leftarrow: "←", in: "∈", mid: "|", ldots: "…",
    dots: "…", cdots: "⋯", propto: "∝", partial: "∂", nabla: "∇", sqrt: "√", pm: "±", lVert: "‖", rVert: "‖",
    "|": "‖", "{": "{", "}": "}", "%": "%", "_": "_", "#": "#", "&": "&", "\\": ";",
  };
  const DROPPED = new Set(["left", "right", "big", "Big", "bigg", "Bigg", "displaystyle", "textstyle", "limits",
                           "nolimits", "quad", "qquad", "label", "nonumber", "notag", ",", ";", ":", "!", " "]);

  // TeX source -> a plain-text approximation for a one-line snippet
  const texToText = (tex) => tex
    .replace(/^\s*(\\\(|\\\[|\$\$?)|(\\\)|\\\]|\$\$?)\s*$/g, "")
    .replace(/\\(begin|end)\{[^}]*\}/g, " ")
    .replace(/\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}/g, "($1)/($2)")
    .replace(/\\(?:mathrm|text|textrm|mathbf|mathit|mathcal|mathbb|operatorname|boldsymbol|texttt)\{([^{}]*)\}/g, "$1")
    .replace(/([_^])\{([^{}]+)\}/g, (_, op, group) => (group.length > 1 ? `${op}(${group})` : op + group))
    .replace(/\s*(?<!\\)&\s*/g, " ")  // alignment points
    .replace(/(?<!\\)[{}]/g, "")  // groups; escaped braces \{ \} stay for the next line
    .replace(/\\([A-Za-z]+|.)/g, (command, name, offset, source) => {
      if (DROPPED.has(name)) return " ";
      const text = SYMBOLS[name] ?? name;
      // \log\sum_j: a word and what follows it must not run together
      return /\w$/.test(text) && /^[\w\\]/.test(source.slice(offset + command.length)) ? `${text} ` : text;
    })
    .replace(/\s+/g, " ")
    .trim();

  const NOT_TEXT = ".bd-header-article, .bd-sidebar-secondary, .prev-next-footer, .bd-footer-article, .onlyprint";

  const plainSnippets = () => {
    if (typeof Search === "undefined" || !Search.htmlToText) return;
    const sphinxHtmlToText = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const page = new DOMParser().parseFromString(htmlString, "text/html");
      page.querySelectorAll(".math").forEach((math) => {
        math.replaceWith(page.createTextNode(` ${texToText(math.textContent)} `));
      });
      // the article header's buttons, the page's tables of contents (on screen and for print) are no text of the page
      page.querySelectorAll(NOT_TEXT).forEach((element) => element.remove());
      return sphinxHtmlToText(page.documentElement.outerHTML, anchor).replace(/\s+/g, " ");
    };
  };
  // searchtools.js loads after this script and starts the search on DOMContentLoaded; this listener runs first.
  document.addEventListener("DOMContentLoaded", plainSnippets);
})();

// 3. Ranking and snippets for glossary names (book/zh_search.py writes window.DL_SEARCH_RANK into zh-search-rank.js).
//    Each query word that is a glossary name adds the name's bonus for the page to Sphinx's score: the glossary
//    first, then the page that teaches the term, then the others by how often they use it; equal scores fall back to
//    reading order, not to the titles as text ("1.", "12.", "2."). A snippet starts at the first place where any name
//    of the entry matched (the page may say "exposure bias" where the reader searched 曝光偏差) and marks every name.
(() => {
  const rank = () => window.DL_SEARCH_RANK || {};
  const queryWords = () => {
    const query = new URLSearchParams(window.location.search).get("q") || "";
    return window.splitQuery(query.trim()).map((word) => word.toLowerCase());
  };
  const entriesOf = (words) => words.map((word) => rank()[word]).filter((entry) => entry);

  // (no "\-": under the u flag an escaped hyphen outside a class is a syntax error)
  const escapeRegExp = (text) => text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
  const namePattern = (names) => new RegExp(
    names.slice().sort((a, b) => b.length - a.length).map((name) => {
      const escaped = escapeRegExp(name);
      return /\p{Script=Han}/u.test(name) ? escaped : `(?<![A-Za-z0-9_])${escaped}(?![A-Za-z0-9_])`;
    }).join("|"), "giu");

  const install = () => {
    if (typeof Scorer === "undefined" || typeof Search === "undefined") return;
    const docOrder = () => (Search._index ? Search._index.docnames : []);
    Scorer.score = (result) => {
      const [docname, , , , score] = result;
      const entries = entriesOf(queryWords());
      const bonus = entries.reduce((sum, entry) => sum + (entry.bonus[docname] || 0), 0);
      const position = docOrder().indexOf(docname);
      // a thousandth per place in reading order breaks ties without outweighing any real difference
      return score + bonus - (position < 0 ? 0 : position / 1000);
    };
    const sphinxSummary = Search.makeSearchSummary;
    Search.makeSearchSummary = (htmlText, keywords, anchor) => {
      const names = [...new Set([...keywords, ...entriesOf(queryWords()).flatMap((entry) => entry.names)])]
        .filter((name) => name && name.length > 0);
      if (names.length === 0) return sphinxSummary(htmlText, keywords, anchor);
      const text = Search.htmlToText(htmlText, anchor);
      if (text === "") return null;
      const pattern = namePattern(names);
      const first = text.search(pattern);
      const start = Math.max((first < 0 ? 0 : first) - 60, 0);
      const shown = (start > 0 ? "..." : "") + text.substr(start, 240).trim() + (start + 240 < text.length ? "..." : "");
      const summary = document.createElement("p");
      summary.classList.add("context");
      let last = 0;
      for (const match of shown.matchAll(pattern)) {
        summary.append(shown.slice(last, match.index));
        const mark = document.createElement("span");
        mark.className = "highlighted";
        mark.textContent = match[0];
        summary.append(mark);
        last = match.index + match[0].length;
      }
      summary.append(shown.slice(last));
      return summary;
    };
  };
  document.addEventListener("DOMContentLoaded", install);
})();
