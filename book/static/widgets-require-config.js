// Map the widget modules to the copies served with the book (see book/offline_assets.py), so that the embed
// manager never falls back to a CDN. embed-amd.js finds its icon fonts next to the path mapped for
// @jupyter-widgets, which is why that prefix points at the folder that holds the fonts.
(() => {
  const here = document.currentScript.src;
  const staticRoot = here.slice(0, here.lastIndexOf("/") + 1);  // .../_static/
  window.requirejs.config({
    paths: {
      "@jupyter-widgets": staticRoot + "widgets",
      anywidget: staticRoot + "anywidget/index",
    },
  });
})();
