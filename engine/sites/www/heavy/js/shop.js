// The heavy shop: every product of data/products.json as a card, filters, sort, a detail view (?item=).
"use strict";

function productCard(p) {
  const url = `shop.html?item=${p.id}`;
  return el("article", {cls: "card"}, [
    el("a", {href: url}, [el("img", {src: p.image, alt: p.name, width: "96", height: "90"})]),
    el("h3", {}, [el("a", {href: url, text: p.name})]),
    el("p", {cls: "desc", text: p.desc}),
    el("div", {cls: "price"}, [el("b", {text: `$${p.price.toFixed(2)}`}), p.was ? el("s", {text: `$${p.was}`}) : null]),
    stars(p.rating),
    el("ul", {cls: "tags"}, p.tags.map(t => el("li", {text: t}))),
    el("button", {cls: "add", type: "button", text: "Add to cart", onclick: addToCart}),
  ]);
}

function filters() {
  const box = document.getElementById("filters");
  for (const [name, values] of [["Category", CATEGORIES], ["Brand", Array.from({length: 24}, (_, i) => `Brand ${i}`)],
                                ["Price", ["Under $10", "$10-25", "$25-50", "$50-100", "$100-200", "Over $200"]],
                                ["Rating", ["4 and up", "3 and up", "2 and up"]]]) {
    box.appendChild(el("fieldset", {}, [el("legend", {text: name}),
      ...values.map(v => el("label", {}, [el("input", {type: "checkbox"}), ` ${v}`]))]));
  }
}

function sorted(list) {
  const by = PARAMS.get("sort");
  const cat = PARAMS.get("cat");
  const out = list.slice();
  if (by === "price") out.sort((a, b) => a.price - b.price);
  else if (by === "rating") out.sort((a, b) => b.rating - a.rating);
  // A category page still shows the whole catalogue, its own category first (keeps the page heavy).
  if (cat) out.sort((a, b) => (b.category === cat) - (a.category === cat));
  return out;
}

function renderGrid(main, list) {
  const grid = el("div", {cls: "grid", id: "grid"});
  const frag = document.createDocumentFragment();
  for (const p of list) frag.appendChild(productCard(p));
  grid.appendChild(frag);
  main.appendChild(grid);
}

async function renderShop() {
  header("Bazaar", "Search 300 products");
  filters();
  footer();
  const products = await loadJSON("data/products.json");
  const main = document.getElementById("main");
  main.textContent = "";
  const item = products.find(p => p.id === PARAMS.get("item"));
  if (item) {
    document.title = `${item.name} – Bazaar`;
    main.appendChild(el("section", {cls: "detail"}, [
      el("img", {src: item.image, alt: item.name}),
      el("div", {}, [el("h1", {text: item.name}), stars(item.rating), el("p", {text: item.desc}),
        el("div", {cls: "price"}, [el("b", {text: `$${item.price.toFixed(2)}`})]),
        el("button", {cls: "add", type: "button", text: "Add to cart", onclick: addToCart}),
        el("ol", {cls: "reviews"}, Array.from({length: 30}, (_, i) => el("li", {}, [
          el("b", {text: `Reviewer ${i}`}), ` ${products[(i * 11) % products.length].desc}`])))]),
    ]));
    main.appendChild(el("h2", {text: "Related products"}));
    renderGrid(main, products.filter(p => p.id !== item.id).slice(0, 150));
  } else {
    const sorts = [["relevance", ""], ["price", "price"], ["rating", "rating"]];
    main.appendChild(el("div", {cls: "toolbar"}, [el("b", {text: `${products.length} products`}),
      ...sorts.map(([label, key]) => el("a", {href: `shop.html?sort=${key}`}, [el("button", {type: "button", text: `Sort: ${label}`})]))]));
    renderGrid(main, sorted(products));
  }
  // Recommendations come from a second request after the first render, as on real shops.
  setTimeout(async () => {
    const more = await loadJSON("data/products.json?recs=1");
    const recs = document.getElementById("recs");
    for (const p of more.slice(200, 230)) recs.appendChild(productCard(p));
  }, 50);
}

renderShop();
