// Shared helpers of the heavy pages: everything on them is built by script from JSON data, like a
// client-rendered shop or news site. No timers keep running after the page is rendered.
"use strict";

function el(tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v;
    else if (k === "cls") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children || []) if (c) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  return node;
}

async function loadJSON(path) {
  const r = await fetch(path);
  return r.json();
}

const PARAMS = new URLSearchParams(location.search);
const CATEGORIES = ["Kitchen", "Garden", "Outdoor", "Toys", "Books", "Audio", "Office", "Bath", "Lighting", "Pets",
  "Tools", "Sports"];
const SECTIONS = ["World", "Business", "Science", "Tech", "Culture", "Sport", "Travel", "Food", "Health", "Opinion"];

function header(brand, searchLabel) {
  const cart = el("span", {cls: "cart", id: "cart", text: "Cart 0"});
  const bar = el("div", {cls: "bar"}, [
    el("a", {cls: "brand", href: "shop.html", text: brand}),
    el("input", {type: "search", placeholder: searchLabel, "aria-label": searchLabel}),
    el("a", {href: "shop.html", text: "Shop"}), el("a", {href: "news.html", text: "News"}), cart,
  ]);
  // A mega menu: 12 columns of links, like a big retailer's header.
  const mega = el("nav", {cls: "mega"});
  CATEGORIES.forEach((c, i) => {
    const col = el("div", {}, [el("b", {text: c})]);
    for (let k = 0; k < 8; k++) {
      col.appendChild(el("a", {href: `shop.html?cat=${c}&sub=${k}`, text: `${c} ${["new", "deals", "top", "gifts",
        "brands", "kids", "pro", "outlet"][k]}`}));
    }
    mega.appendChild(col);
    if (i === 5) mega.appendChild(el("div", {}, SECTIONS.map(s => el("a", {href: `news.html?section=${s}`, text: s}))));
  });
  const top = document.getElementById("top");
  top.append(bar, mega);
}

function footer() {
  const foot = document.getElementById("foot");
  for (let i = 0; i < 120; i++) {
    foot.appendChild(i % 2 ? el("a", {href: `news.html?article=${i}`, text: `Help topic ${i}`})
                           : el("a", {href: `shop.html?item=h${String(i).padStart(3, "0")}`, text: `Popular ${i}`}));
  }
}

function stars(rating) {
  const on = Math.round(rating);
  return el("div", {cls: "stars", title: `${rating} of 5`}, [el("span", {text: "★".repeat(on)}),
    el("span", {cls: "off", text: "★".repeat(5 - on)}), ` ${rating}`]);
}

let cartCount = 0;
function addToCart() {
  cartCount += 1;
  document.getElementById("cart").textContent = `Cart ${cartCount}`;
}
