// Flight results: flights.html?trip=&from=&to=&depart=&return=&pax=&cabin=[&sort=&nonstop=1][&out=<id>]
// A round trip is chosen in two steps: the outbound list, then (with out=<id>) the return list.
(function () {
  "use strict";
  Site.renderChrome("flights");
  const p = Site.params();
  const esc = Site.escapeHtml;
  const main = document.getElementById("results-area");
  const round = p.trip !== "oneway";
  const pax = parseInt(p.pax, 10);
  const cabin = Inventory.cabin(p.cabin);
  const search = { trip: round ? "round" : "oneway", from: p.from, to: p.to, depart: p.depart, return: round ? p.return : "",
    pax: p.pax, cabin: p.cabin };

  const valid = Inventory.airport(p.from) && Inventory.airport(p.to) && p.from !== p.to && Site.isDate(p.depart) &&
    (!round || (Site.isDate(p.return) && p.return >= p.depart)) && pax >= 1 && pax <= 9 && cabin;
  if (!valid) {
    main.innerHTML = '<div class="alert" role="alert">This search is incomplete or not valid. <a href="index.html?' +
      Site.query(search) + '">Go back to the search form</a></div>';
    return;
  }

  const outbound = p.out ? Inventory.findFlight(p.out, p.from, p.to, p.cabin) : null;
  const leg = round && outbound ? "return" : "outbound";
  const legFrom = leg === "return" ? p.to : p.from;
  const legTo = leg === "return" ? p.from : p.to;
  const legDate = leg === "return" ? p.return : p.depart;
  document.title = Site.airportLabel(legFrom) + " to " + Site.airportLabel(legTo) + " – Skyway Travel";

  const sort = p.sort || "price";
  let list = Inventory.flights(legFrom, legTo, legDate, p.cabin);
  if (p.nonstop === "1") list = list.filter((f) => f.stops === 0);
  const cmp = {
    price: (a, b) => a.price - b.price || a.depart - b.depart,
    departure: (a, b) => a.depart - b.depart,
    duration: (a, b) => a.minutes - b.minutes || a.price - b.price,
  }[sort] || ((a, b) => a.price - b.price);
  list.sort(cmp);

  function card(f, selectHref) {
    return '<article class="flight-card" data-flight="' + f.id + '">' +
      '<div class="airline"><strong>' + esc(f.airline) + '</strong><span class="flight-number">' + f.number + "</span></div>" +
      '<div class="times"><div class="time"><b>' + f.departTime + "</b><span>" + f.from + "</span></div>" +
      '<div class="route-line"><span class="duration">' + f.durationText + "</span><hr><span class=\"stops\">" +
      (f.stops ? "1 stop via " + f.via : "Nonstop") + "</span></div>" +
      '<div class="time"><b>' + f.arriveTime + (f.dayOffset > 0 ? "<sup>+" + f.dayOffset + "</sup>" : "") + "</b><span>" + f.to +
      "</span></div></div>" +
      '<div class="fare"><div class="price">' + Site.money(f.price) + '</div><div class="per">per person</div>' +
      '<div class="total">Total for ' + pax + " traveller" + (pax > 1 ? "s" : "") + ": " + Site.money(f.price * pax) + "</div>" +
      (f.seats < 5 ? '<div class="seats">Only ' + f.seats + " seats left</div>" : "") +
      (selectHref ? '<a class="btn select-flight" data-flight="' + f.id + '" href="' + selectHref + '">Select</a>' : "") +
      "</div></article>";
  }
  function selectHref(f) {
    if (leg === "outbound" && round) return "flights.html?" + Site.query(Object.assign({}, search, { out: f.id }));
    if (leg === "outbound") return "book.html?" + Site.query(Object.assign({}, search, { out: f.id }));
    return "book.html?" + Site.query(Object.assign({}, search, { out: outbound.id, ret: f.id }));
  }

  const hidden = Object.assign({}, search, outbound ? { out: outbound.id } : {});
  const steps = round ? ["Outbound flight", "Return flight", "Passenger details"] : ["Flight", "Passenger details"];
  const current = leg === "return" ? 1 : 0;
  main.innerHTML =
    '<div class="search-summary"><div><strong>' + esc(Site.airportLabel(p.from)) + " → " + esc(Site.airportLabel(p.to)) +
    "</strong> · " + Inventory.longDate(p.depart) + (round ? " – " + Inventory.longDate(p.return) : " · One way") + " · " + pax +
    " passenger" + (pax > 1 ? "s" : "") + " · " + cabin.label + '</div><a id="modify-search" href="index.html?' + Site.query(search) +
    '">Modify search</a></div>' +
    '<ol class="steps">' + steps.map((s, i) => "<li" + (i === current ? ' class="current"' : i < current ? ' class="done"' : "") + ">" +
      s + "</li>").join("") + "</ol>" +
    (outbound ? '<h2>Your outbound flight</h2><div class="chosen">' + card(outbound, "") + '<a id="change-outbound" href="flights.html?' +
      Site.query(search) + '">Change outbound flight</a></div>' : "") +
    "<h2 id=\"leg-title\">" + (leg === "return" ? "Choose your return flight" : round ? "Choose your outbound flight" : "Choose your flight") +
    ": " + esc(Site.airportLabel(legFrom)) + " → " + esc(Site.airportLabel(legTo)) + ", " + Inventory.longDate(legDate) + "</h2>" +
    '<form class="toolbar" id="sort-form" method="get" action="flights.html">' +
    Object.entries(hidden).filter(([, v]) => v).map(([k, v]) => '<input type="hidden" name="' + k + '" value="' + esc(v) + '">').join("") +
    '<label for="sort">Sort by</label><select id="sort" name="sort">' +
    [["price", "Cheapest first"], ["departure", "Earliest departure"], ["duration", "Fastest first"]].map(([k, l]) =>
      '<option value="' + k + '"' + (k === sort ? " selected" : "") + ">" + l + "</option>").join("") + "</select>" +
    '<label class="check"><input type="checkbox" id="nonstop" name="nonstop" value="1"' + (p.nonstop === "1" ? " checked" : "") +
    "> Nonstop only</label><span class=\"count\" id=\"flight-count\">" + list.length + " flight" + (list.length === 1 ? "" : "s") +
    "</span></form>" +
    '<div id="flight-list">' + (list.length ? list.map((f) => card(f, selectHref(f))).join("")
      : '<div class="empty">No flights match your filters. Try including flights with stops.</div>') + "</div>";

  const sortForm = document.getElementById("sort-form");
  sortForm.querySelectorAll("select, input[type=checkbox]").forEach((el) => el.addEventListener("change", () => sortForm.submit()));
})();
