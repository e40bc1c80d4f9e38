// Booking form for a chosen flight itinerary (book.html?...&out=<id>[&ret=<id>]) or a hotel stay
// (book.html?kind=hotel&hotel=<id>&checkin=&checkout=&guests=&rooms=). Validates the details,
// shows a live price summary, stores the booking and opens the confirmation page.
(function () {
  "use strict";
  Site.renderChrome(Site.param("kind") === "hotel" ? "hotels" : "flights");
  const p = Site.params();
  const esc = Site.escapeHtml;
  const area = document.getElementById("booking-area");
  const FEES = window.TRAVEL_FEES;
  const NAME = /^[A-Za-z\u00C0-\u017F][A-Za-z\u00C0-\u017F' -]*$/;
  const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;

  function field(id, label, type, extra) {
    return '<div class="field' + (extra || "") + '"><label for="' + id + '">' + label + "</label>" +
      (type === "textarea" ? '<textarea id="' + id + '" name="' + id + '" rows="3"></textarea>'
        : '<input id="' + id + '" name="' + id + '" type="' + type + '" autocomplete="off">') + "</div>";
  }
  function select(id, label, options) {
    return '<div class="field"><label for="' + id + '">' + label + '</label><select id="' + id + '" name="' + id + '">' +
      options.map(([v, l]) => '<option value="' + v + '">' + l + "</option>").join("") + "</select></div>";
  }
  const terms = '<label class="check"><input type="checkbox" id="terms" name="terms"> I have read and accept the fare rules and ' +
    "booking conditions.</label>";
  function fail(text) {
    area.innerHTML = '<div class="alert" role="alert">' + text + ' <a href="index.html">Start a new search</a></div>';
  }
  function store(booking) {
    const list = Site.bookings().filter((b) => b.ref !== booking.ref);
    list.push(booking);
    Site.saveBookings(list);
    location.href = "confirmation.html?ref=" + booking.ref;
  }
  function summaryRows(rows, total) {
    return rows.map(([l, v]) => '<div class="row"><span>' + l + "</span><span>" + Site.money(v) + "</span></div>").join("") +
      '<div class="row total"><span>Total</span><span id="total-price">' + Site.money(total) + "</span></div>";
  }

  // ------------------------------------------------------------------ flights
  function flightBooking() {
    const round = p.trip !== "oneway";
    const pax = parseInt(p.pax, 10);
    const cabin = Inventory.cabin(p.cabin);
    const out = Inventory.findFlight(p.out, p.from, p.to, p.cabin);
    const ret = round ? Inventory.findFlight(p.ret, p.to, p.from, p.cabin) : null;
    if (!out || (round && !ret) || !(pax >= 1 && pax <= 9) || !cabin) {
      fail("We could not find the selected flights.");
      return;
    }
    const legs = ret ? [out, ret] : [out];
    document.title = "Passenger details – Skyway Travel";
    let passengers = "";
    for (let i = 1; i <= pax; i++) {
      passengers += '<fieldset class="passenger"><legend>Passenger ' + i + (i === 1 ? " (lead passenger)" : "") +
        '</legend><div class="form-grid">' + field("first-name-" + i, "First name", "text") + field("last-name-" + i, "Last name", "text") +
        "</div></fieldset>";
    }
    area.innerHTML =
      '<div class="layout-2col"><form id="booking-form" novalidate><h1>Passenger details</h1><div id="booking-errors"></div>' +
      passengers + '<fieldset><legend>Contact</legend><div class="form-grid">' + field("email", "Email address", "email") +
      field("phone", "Phone number (optional)", "tel") + "</div></fieldset>" +
      '<fieldset><legend>Extras</legend><div class="form-grid">' +
      select("seat", "Seat preference", [["none", "No preference"], ["window", "Window seat"], ["aisle", "Aisle seat"]]) +
      select("bags", "Checked bags per passenger", [["0", "No checked bags"], ["1", "1 checked bag (+$35 per flight)"],
        ["2", "2 checked bags (+$70 per flight)"]]) +
      '</div><label class="check"><input type="checkbox" id="insurance" name="insurance"> Add travel insurance ($' +
      FEES.insurancePerPassenger + " per passenger)</label></fieldset>" + terms +
      '<p><button class="btn big" id="confirm-booking" type="submit">Confirm booking</button></p></form>' +
      '<aside class="summary"><h2>Your trip</h2>' + legs.map((f, i) =>
        '<div class="leg"><div class="leg-title">' + (i === 0 ? "Outbound" : "Return") + " · " + Inventory.longDate(f.date) +
        "</div><div>" + f.departTime + " " + f.from + " → " + f.arriveTime + " " + f.to + "</div><div class=\"muted\">" +
        esc(f.airline) + " " + f.number + " · " + (f.stops ? "1 stop via " + f.via : "Nonstop") + " · " + cabin.label +
        "</div></div>").join("") + '<div id="price-summary"></div></aside></div>';

    const form = document.getElementById("booking-form");
    function price() {
      const bags = +form.bags.value;
      const rows = legs.map((f, i) => [(i === 0 ? "Outbound" : "Return") + " fare (" + pax + " × " + Site.money(f.price) + ")", f.price * pax]);
      rows.push(["Taxes and fees", FEES.taxesPerPassengerPerFlight * pax * legs.length]);
      if (bags) rows.push(["Checked bags", FEES.bagPrice * bags * pax * legs.length]);
      if (form.insurance.checked) rows.push(["Travel insurance", FEES.insurancePerPassenger * pax]);
      const total = rows.reduce((s, r) => s + r[1], 0);
      document.getElementById("price-summary").innerHTML = summaryRows(rows, total);
      return total;
    }
    form.bags.addEventListener("change", price);
    form.insurance.addEventListener("change", price);
    price();

    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const errors = [];
      const people = [];
      for (let i = 1; i <= pax; i++) {
        const first = form["first-name-" + i].value.trim();
        const last = form["last-name-" + i].value.trim();
        if (!first) errors.push({ field: "first-name-" + i, text: "Enter the first name of passenger " + i + "." });
        else if (!NAME.test(first)) errors.push({ field: "first-name-" + i, text: "Names may only contain letters, spaces, hyphens and apostrophes." });
        if (!last) errors.push({ field: "last-name-" + i, text: "Enter the last name of passenger " + i + "." });
        else if (!NAME.test(last)) errors.push({ field: "last-name-" + i, text: "Names may only contain letters, spaces, hyphens and apostrophes." });
        people.push({ first, last });
      }
      const email = form.email.value.trim();
      const phone = form.phone.value.trim();
      if (!EMAIL.test(email)) errors.push({ field: "email", text: "Enter a valid email address." });
      if (phone && !/^\+?[\d\s-]{7,}$/.test(phone)) errors.push({ field: "phone", text: "Enter a valid phone number or leave it empty." });
      if (!form.terms.checked) errors.push({ field: "terms", text: "You must accept the fare rules to continue." });
      Site.showErrors(document.getElementById("booking-errors"), errors);
      if (errors.length) {
        window.scrollTo(0, 0);
        return;
      }
      const ref = Inventory.reference([out.id, ret ? ret.id : "", people.map((x) => x.first + " " + x.last).join(","), email].join("|"));
      store({
        ref, kind: "flight", status: "confirmed", email, phone, cabin: cabin.id, pax, seat: form.seat.value, bags: +form.bags.value,
        insurance: form.insurance.checked, passengers: people, total: price(),
        flights: legs.map((f) => ({ id: f.id, number: f.number, airline: f.airline, from: f.from, to: f.to, date: f.date,
          departTime: f.departTime, arriveTime: f.arriveTime, stops: f.stops, via: f.via })),
      });
    });
  }

  // ------------------------------------------------------------------ hotels
  function hotelBooking() {
    const hotel = Inventory.findHotel(p.hotel);
    const nights = Inventory.nights(p.checkin, p.checkout);
    const guests = parseInt(p.guests, 10);
    const rooms = parseInt(p.rooms, 10) || 1;
    if (!hotel || !(nights >= 1 && nights <= 30) || !(guests >= 1 && guests <= 8)) {
      fail("We could not find the selected hotel stay.");
      return;
    }
    document.title = "Guest details – " + hotel.name + " – Skyway Travel";
    area.innerHTML =
      '<div class="layout-2col"><form id="booking-form" novalidate><h1>Guest details</h1><div id="booking-errors"></div>' +
      '<fieldset><legend>Lead guest</legend><div class="form-grid">' + field("first-name", "First name", "text") +
      field("last-name", "Last name", "text") + field("email", "Email address", "email", " wide") + "</div></fieldset>" +
      '<fieldset><legend>Your stay</legend><div class="form-grid">' +
      select("arrival", "Estimated arrival time", [["unknown", "I don't know yet"], ["morning", "Before noon"],
        ["afternoon", "Afternoon (12:00-18:00)"], ["evening", "Evening (after 18:00)"]]) + "</div>" +
      '<label class="check"><input type="checkbox" id="breakfast" name="breakfast"> Add breakfast ($' + FEES.breakfastPerGuestPerNight +
      " per guest per night)</label>" + field("requests", "Special requests (optional)", "textarea", " wide") + "</fieldset>" + terms +
      '<p><button class="btn big" id="confirm-booking" type="submit">Confirm booking</button></p></form>' +
      '<aside class="summary"><h2>' + esc(hotel.name) + '</h2><div class="muted">' + "★".repeat(hotel.stars) + " · " + esc(hotel.city) +
      "</div><div class=\"leg\">" + Inventory.longDate(p.checkin) + " → " + Inventory.longDate(p.checkout) + "<br>" + nights + " night" +
      (nights > 1 ? "s" : "") + " · " + guests + " guest" + (guests > 1 ? "s" : "") + " · " + rooms + " room" + (rooms > 1 ? "s" : "") +
      '</div><div id="price-summary"></div></aside></div>';

    const form = document.getElementById("booking-form");
    function price() {
      const room = hotel.price * nights * rooms;
      const rows = [["Room (" + rooms + " × " + nights + " nights × " + Site.money(hotel.price) + ")", room],
        ["Taxes (10%)", Math.round(room * FEES.hotelTaxRate)]];
      if (form.breakfast.checked) rows.push(["Breakfast", FEES.breakfastPerGuestPerNight * guests * nights]);
      const total = rows.reduce((s, r) => s + r[1], 0);
      document.getElementById("price-summary").innerHTML = summaryRows(rows, total);
      return total;
    }
    form.breakfast.addEventListener("change", price);
    price();

    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const errors = [];
      const first = form["first-name"].value.trim();
      const last = form["last-name"].value.trim();
      const email = form.email.value.trim();
      if (!first || !NAME.test(first)) errors.push({ field: "first-name", text: "Enter the lead guest's first name (letters only)." });
      if (!last || !NAME.test(last)) errors.push({ field: "last-name", text: "Enter the lead guest's last name (letters only)." });
      if (!EMAIL.test(email)) errors.push({ field: "email", text: "Enter a valid email address." });
      if (!form.terms.checked) errors.push({ field: "terms", text: "You must accept the booking conditions to continue." });
      Site.showErrors(document.getElementById("booking-errors"), errors);
      if (errors.length) {
        window.scrollTo(0, 0);
        return;
      }
      const ref = Inventory.reference([hotel.id, p.checkin, p.checkout, rooms, guests, first + " " + last, email].join("|"));
      store({
        ref, kind: "hotel", status: "confirmed", email, guest: { first, last }, arrival: form.arrival.value,
        breakfast: form.breakfast.checked, requests: form.requests.value.trim(), checkin: p.checkin, checkout: p.checkout,
        nights, guests, rooms, total: price(), hotel: { id: hotel.id, name: hotel.name, city: hotel.city, stars: hotel.stars },
      });
    });
  }

  if (p.kind === "hotel") hotelBooking();
  else flightBooking();
})();
