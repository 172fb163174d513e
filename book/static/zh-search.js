// Split a search query into the words of the search index (see book/zh_search.py).
// Runs of Han characters are cut greedily into the longest index terms; characters that start no term are
// dropped (the index keeps no one-character words). Everything else is split as Sphinx does by default.
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
