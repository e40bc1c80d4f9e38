// The heavy news front page: every article of data/articles.json as a story card, sidebars, tabs,
// and an article view (?article=N).
"use strict";

function story(a) {
  const url = `news.html?article=${a.id}`;
  return el("article", {cls: "card story"}, [
    el("a", {href: url}, [el("img", {src: a.image, alt: "", width: "72", height: "72"})]),
    el("h2", {}, [el("a", {href: url, text: a.title})]),
    el("p", {cls: "meta"}, [el("span", {text: a.section}), el("span", {text: a.author}), el("span", {text: `${a.minutes} min`})]),
    el("p", {cls: "sum", text: a.summary}),
    el("ul", {cls: "tags"}, a.tags.map(t => el("li", {}, [el("a", {href: `news.html?section=${t}`, text: t})]))),
  ]);
}

function renderStories(main, list) {
  const old = document.getElementById("stories");
  if (old) old.remove();
  const grid = el("div", {cls: "grid", id: "stories"});
  const frag = document.createDocumentFragment();
  for (const a of list) frag.appendChild(story(a));
  grid.appendChild(frag);
  main.appendChild(grid);
}

function sidebar(articles) {
  const side = document.getElementById("side");
  side.appendChild(el("div", {cls: "box"}, [el("h3", {text: "Most read"}),
    el("ol", {}, articles.slice(0, 60).map(a => el("li", {}, [el("a", {href: `news.html?article=${a.id}`, text: a.title})])))]));
  side.appendChild(el("div", {cls: "box"}, [el("h3", {text: "Live"}),
    el("ul", {}, articles.slice(60, 110).map((a, i) => el("li", {}, [el("b", {text: `${8 + (i >> 2)}:${String((i * 7) % 60).padStart(2, "0")} `}),
      el("a", {href: `news.html?article=${a.id}`, text: a.summary.slice(0, 70)})])))]));
}

async function renderNews() {
  header("The Daily Heavy", "Search the news");
  footer();
  const articles = await loadJSON("data/articles.json");
  const main = document.getElementById("main");
  main.textContent = "";
  sidebar(articles);
  const n = PARAMS.get("article");
  const current = n === null ? null : articles[Number(n) % articles.length];
  if (current) {
    document.title = `${current.title} – The Daily Heavy`;
    main.appendChild(el("article", {cls: "box body"}, [el("h1", {text: current.title}),
      el("img", {src: current.image, alt: "", width: "320", height: "200"}),
      ...current.body.concat(current.body).map(t => el("p", {text: t}))]));
    main.appendChild(el("h2", {text: "Related"}));
    renderStories(main, articles.filter(a => a.id !== current.id));
    return;
  }
  const section = PARAMS.get("section");
  main.appendChild(el("div", {cls: "lead"}, articles.slice(0, 3).map(a => el("article", {}, [
    el("img", {src: a.image, alt: ""}), el("h2", {}, [el("a", {href: `news.html?article=${a.id}`, text: a.title})]),
    el("p", {text: a.summary})]))));
  // Section tabs re-render the whole story list in the page (an in-page step that rebuilds ~2k nodes).
  const tabs = el("div", {cls: "tabs toolbar"}, ["All", ...SECTIONS].map(s => el("button", {
    type: "button", cls: (section || "All") === s ? "on" : "", text: s, onclick: (ev) => {
      for (const b of tabs.children) b.className = "";
      ev.target.className = "on";
      const first = articles.filter(a => s === "All" || a.section === s);
      renderStories(main, first.concat(articles.filter(a => !first.includes(a))));
    }})));
  main.appendChild(tabs);
  const first = articles.filter(a => !section || a.section === section);
  renderStories(main, first.concat(articles.filter(a => !first.includes(a))));
}

renderNews();
