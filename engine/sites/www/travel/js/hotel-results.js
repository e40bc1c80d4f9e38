// Hotel results: hotel-results.html?city=&checkin=&checkout=&guests=&rooms=[&sort=&stars=]
(function () {
  "use strict";
  Site.renderChrome("hotels");
  const p = Site.params();
  const esc = Site.escapeHtml;
  const area = document.getElementById("results-area");
  const nights = Inventory.nights(p.checkin, p.checkout);
  const guests = parseInt(p.guests, 10);
  const rooms = parseInt(p.rooms, 10) || 1;
  const search = { city: p.city, checkin: p.checkin, checkout: p.checkout, guests: p.guests, rooms: String(rooms) };
  if (!Inventory.airport(p.city) || !(nights >= 1 && nights <= 30) || !(guests >= 1 && guests <= 8)) {
    area.innerHTML = '<div class="alert" role="alert">This search is incomplete or not valid. <a href="hotels.html?' + Site.query(search) +
      '">Go back to the search form</a></div>';
    return;
  }
  const city = Inventory.airport(p.city).city;
  document.title = "Hotels in " + city + " – Skyway Travel";
  const sort = p.sort || "recommended";
  const minStars = parseInt(p.stars, 10) || 0;
  let list = Inventory.hotels(p.city).filter((h) => h.stars >= minStars);
  const cmp = {
    recommended: (a, b) => b.rating * 20 - b.price / 10 - (a.rating * 20 - a.price / 10),
    price: (a, b) => a.price - b.price,
    rating: (a, b) => b.rating - a.rating || a.price - b.price,
  }[sort] || (() => 0);
  list = list.sort(cmp);

  const options = (items, current) => items.map(([v, l]) => '<option value="' + v + '"' + (v === current ? " selected" : "") + ">" + l +
    "</option>").join("");
  area.innerHTML =
    '<div class="search-summary"><div><strong>Hotels in ' + esc(city) + "</strong> · " + Inventory.longDate(p.checkin) + " – " +
    Inventory.longDate(p.checkout) + " · " + nights + " night" + (nights > 1 ? "s" : "") + " · " + guests + " guest" + (guests > 1 ? "s" : "") +
    " · " + rooms + " room" + (rooms > 1 ? "s" : "") + '</div><a id="modify-search" href="hotels.html?' + Site.query(search) +
    '">Modify search</a></div>' +
    '<form class="toolbar" id="sort-form" method="get" action="hotel-results.html">' +
    Object.entries(search).map(([k, v]) => '<input type="hidden" name="' + k + '" value="' + esc(v) + '">').join("") +
    '<label for="sort">Sort by</label><select id="sort" name="sort">' +
    options([["recommended", "Recommended"], ["price", "Lowest price"], ["rating", "Guest rating"]], sort) + "</select>" +
    '<label for="stars">Stars</label><select id="stars" name="stars">' +
    options([["", "Any"], ["3", "3 stars or more"], ["4", "4 stars or more"], ["5", "5 stars only"]], p.stars || "") + "</select>" +
    '<span class="count" id="hotel-count">' + list.length + " hotel" + (list.length === 1 ? "" : "s") + "</span></form>" +
    '<div id="hotel-list">' + (list.length ? list.map((h) =>
      '<article class="hotel-card" data-hotel="' + h.id + '"><div class="hotel-img"><img src="img/hotel.svg" alt="" width="150" height="110"></div>' +
      '<div class="hotel-info"><h3 class="hotel-name">' + esc(h.name) + '</h3><div class="stars">' + "★".repeat(h.stars) +
      '<span class="muted"> ' + h.stars + "-star hotel</span></div><div class=\"muted\">" + h.distance + " km from the city centre</div>" +
      '<div class="amenities">' + h.amenities.map(esc).join(" · ") + '</div></div><div class="fare"><div class="rating">' +
      h.rating.toFixed(1) + '</div><div class="per">guest rating</div><div class="price">' + Site.money(h.price) +
      '</div><div class="per">per night</div><div class="total">' + nights + " night" + (nights > 1 ? "s" : "") + ", " + rooms + " room" +
      (rooms > 1 ? "s" : "") + ": " + Site.money(h.price * nights * rooms) + '</div><a class="btn book-hotel" data-hotel="' + h.id +
      '" href="book.html?' + Site.query(Object.assign({ kind: "hotel", hotel: h.id }, search)) + '">Book</a></div></article>').join("")
      : '<div class="empty">No hotels match your filters.</div>') + "</div>";
  const sortForm = document.getElementById("sort-form");
  sortForm.querySelectorAll("select").forEach((el) => el.addEventListener("change", () => sortForm.submit()));
})();
