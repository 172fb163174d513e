// Show which boxes of a page scroll sideways: code, printed output, computed tables, wide tables and math.
// On a phone (and in many code cells on a desktop) such a box is cut at its right edge, and a touch screen shows no
// scroll bar until one scrolls, so nothing says that more is there. Each box that is wider inside than outside gets
// the class dl-scrolls, and dl-more-left / dl-more-right while there is more to that side; book/static/course.css
// draws a shadow on that edge. Boxes are looked at again when the page changes (MathJax typesets, widgets are drawn,
// fonts arrive) and when the window is resized.
(() => {
  const BOXES = [
    "pre", ".dl-table-wrap", ".pst-scrollable-table-container", ".table-wrapper", "div.math",
    'mjx-container[display="true"]', ".cell_output .output", ".widget-subarea", ".jp-OutputArea-output",
  ].join(", ");
  const SCROLLING = new Set(["auto", "scroll"]);
  const SLACK = 2; // px: rounding, and borders that do not count as more content

  const update = (box) => {
    const more = box.scrollWidth - box.clientWidth;
    const scrolls = more > SLACK && SCROLLING.has(getComputedStyle(box).overflowX);
    box.classList.toggle("dl-scrolls", scrolls);
    box.classList.toggle("dl-more-left", scrolls && box.scrollLeft > SLACK);
    box.classList.toggle("dl-more-right", scrolls && box.scrollLeft < more - SLACK);
  };

  // Inline math cannot break across lines, and the theme clips a formula wider than the line (a formula with text in
  // it, on a phone). Such a formula becomes a box that scrolls (course.css, span.math.dl-wide-math).
  const markWideInlineMath = (article) => {
    article.querySelectorAll("span.math:not(.dl-wide-math)").forEach((math) => {
      const drawn = math.querySelector("mjx-math");
      if (drawn && drawn.getBoundingClientRect().width > math.clientWidth + SLACK) math.classList.add("dl-wide-math");
    });
  };

  const watched = new WeakSet();
  const scan = () => {
    const article = document.querySelector("article.bd-article") || document.body;
    markWideInlineMath(article);
    article.querySelectorAll(`${BOXES}, span.math.dl-wide-math`).forEach((box) => {
      update(box);
      if (!watched.has(box)) {
        watched.add(box);
        box.addEventListener("scroll", () => update(box), { passive: true });
      }
    });
  };

  let pending = null;
  const scanSoon = () => {
    if (pending === null) pending = setTimeout(() => { pending = null; scan(); }, 100);
  };

  document.addEventListener("DOMContentLoaded", () => {
    scan();
    window.addEventListener("resize", scanSoon);
    const article = document.querySelector("article.bd-article");
    if (article) new MutationObserver(scanSoon).observe(article, { childList: true, subtree: true });
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) MathJax.startup.promise.then(scanSoon);
    if (document.fonts) {  // a web font that arrives late changes how wide the text is
      document.fonts.ready.then(scanSoon);
      document.fonts.addEventListener("loadingdone", scanSoon);
    }
  });
  window.addEventListener("load", scanSoon);
})();
