// Make the article header's ☰ (chapter list) and page-contents buttons work.
// pydata-sphinx-theme 0.17.1 and sphinx-book-theme 1.3.0 attach their handlers to the page's *first* .primary-toggle
// and .secondary-toggle, which sit in the top navbar, where sphinx-book-theme hides them. The buttons a reader sees
// are later copies in the article header and get no handler: below 992 px a phone reader cannot open the chapter
// list, and on a desktop ☰ does not collapse the sidebar. Each visible copy forwards its click to the wired button,
// whose handlers then do what the themes intend (collapse the sidebar on wide screens, open it as a dialog on narrow).
document.addEventListener("DOMContentLoaded", () => {
  const titles = { primary: "显示或隐藏章节目录", secondary: "本页目录" };
  for (const [kind, title] of Object.entries(titles)) {
    const [wired, ...copies] = document.querySelectorAll(`.${kind}-toggle`);
    for (const copy of copies) {
      copy.setAttribute("title", title);
      copy.setAttribute("aria-label", title);
      copy.addEventListener("click", (event) => {
        event.preventDefault();
        event.stopPropagation();
        wired.click();
      });
    }
  }
});
