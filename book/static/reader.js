// book/reader_fixes.py: phone tables and figures, tooltips, the TOC drawer, the EOS mark. Offline, no dependencies.
(() => {
  const PHONE = window.matchMedia("(max-width: 575.98px)");
  const FIGURE_DPI = 150;  // the resolution of the PNGs the book stores (their pHYs chunk; tests/site/test_reader_browser.py checks)
  const MIN_SCALE = 72 / FIGURE_DPI;  // at this scale a 10-pt label is 10 CSS px
  const TITLES = {
    "Toggle primary sidebar": "显示或隐藏章节目录",
    "Toggle secondary sidebar": "本页目录",
    "Color mode": "浅色 / 深色",
    "System Settings": "跟随系统",
    "Light": "浅色",
    "Dark": "深色",
    "Search": "搜索",
    "Link to this heading": "链接到本节",
    "Link to this equation": "链接到本式",
    "Link to this image": "链接到本图",
    "Link to this table": "链接到本表",
    "Link to this code": "链接到本段代码",
    "Toggle hidden content": "显示或隐藏内容",
    "Copy": "复制",
    "Copy to clipboard": "复制到剪贴板",
  };

  // Prose tables (Markdown's): each cell learns its column's name, for the phone's one-card-per-row layout.
  const cardTables = () => {
    document.querySelectorAll(".bd-article table").forEach((table) => {
      if (table.closest(".cell_output, .output") || table.classList.contains("dl-table")) return;
      const heads = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
      if (heads.length < 3) return;
      table.classList.add("dl-cards");
      table.querySelectorAll("tbody tr").forEach((row) => {
        [...row.children].forEach((cell, i) => cell.setAttribute("data-label", heads[i] || ""));
      });
    });
  };

  // Figures: tap to enlarge; on a phone, never smaller than print size (in a box that scrolls sideways).
  const openZoom = (img) => {
    const overlay = document.createElement("div");
    overlay.className = "dl-zoom";
    overlay.setAttribute("role", "dialog");
    overlay.setAttribute("aria-label", "放大的图（点击或按 Esc 关闭）");
    const big = document.createElement("img");
    big.src = img.currentSrc || img.src;
    big.alt = img.alt || "";
    big.style.width = `${img.naturalWidth}px`;
    const close = document.createElement("button");
    close.className = "dl-zoom-close";
    close.type = "button";
    close.textContent = "×";
    close.setAttribute("aria-label", "关闭");
    overlay.append(close, big);
    const shut = () => {
      overlay.remove();
      document.removeEventListener("keydown", onKey);
    };
    const onKey = (event) => { if (event.key === "Escape") shut(); };
    overlay.addEventListener("click", shut);
    document.addEventListener("keydown", onKey);
    document.body.append(overlay);
  };
  const fitFigure = (img) => {
    if (!img.naturalWidth) return;
    const wanted = Math.round(img.naturalWidth * MIN_SCALE);
    let box = img.parentElement.classList.contains("dl-figure-scroll") ? img.parentElement : null;
    const column = (box || img.parentElement).clientWidth;
    if (PHONE.matches && wanted > column) {
      if (!box) {
        box = document.createElement("div");
        box.className = "dl-figure-scroll dl-scrolls";
        img.replaceWith(box);
        box.append(img);
      }
      img.style.width = `${wanted}px`;
    } else {
      img.style.width = "";
    }
  };
  const figures = () => {
    document.querySelectorAll(".bd-article img").forEach((img) => {
      if (img.closest(".dl-zoom, .widget-subarea, .jupyter-widgets, a")) return;
      img.classList.add("dl-zoomable");
      img.setAttribute("title", "点击放大");
      img.addEventListener("click", () => openZoom(img));
      if (img.complete) fitFigure(img);
      else img.addEventListener("load", () => fitFigure(img), { once: true });
    });
    PHONE.addEventListener("change", () => document.querySelectorAll("img.dl-zoomable").forEach(fitFigure));
  };

  // Chinese titles for the theme's buttons (their tooltips come from these attributes).
  const titles = () => {
    document.querySelectorAll("[title], [aria-label], [data-bs-title], [data-bs-original-title]").forEach((el) => {
      for (const attribute of ["title", "aria-label", "data-bs-title", "data-bs-original-title"]) {
        const text = el.getAttribute(attribute);
        if (text && TITLES[text.trim()]) el.setAttribute(attribute, TITLES[text.trim()]);
      }
    });
  };

  // The drawers (chapter list, page contents) close once a link in them is followed.
  const drawers = () => {
    ["pst-primary-sidebar-modal", "pst-secondary-sidebar-modal"].forEach((id) => {
      const dialog = document.getElementById(id);
      if (!dialog) return;
      dialog.addEventListener("click", (event) => {
        const link = event.target.closest("a[href]");
        if (link && dialog.open) dialog.close();
      });
    });
  };

  // ␃ (U+2403, the EOS mark) as a boxed "EOS": no font the README installs draws it.
  const EOS = "\u2403";
  const markEos = (root) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: (node) => (node.nodeValue.includes(EOS) && !node.parentElement.closest(".dl-eos, script, style")
        ? NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_REJECT),
    });
    const found = [];
    while (walker.nextNode()) found.push(walker.currentNode);
    found.forEach((node) => {
      const parts = node.nodeValue.split(EOS);
      const fragment = document.createDocumentFragment();
      parts.forEach((part, i) => {
        if (i > 0) {
          const mark = document.createElement("span");
          mark.className = "dl-eos";
          mark.textContent = "EOS";
          mark.title = "EOS（结束符 ␃）";
          fragment.append(mark);
        }
        if (part) fragment.append(part);
      });
      node.replaceWith(fragment);
    });
  };
  const watchEos = () => {
    const article = document.querySelector(".bd-article") || document.body;
    markEos(article);
    let queued = false;
    new MutationObserver(() => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => { queued = false; markEos(article); });
    }).observe(article, { childList: true, subtree: true, characterData: true });
  };

  document.addEventListener("DOMContentLoaded", () => {
    cardTables();
    figures();
    titles();
    drawers();
    watchEos();
    setTimeout(titles, 0);  // after the theme's own DOMContentLoaded work
  });
})();
