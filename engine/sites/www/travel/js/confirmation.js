// Booking confirmation: confirmation.html?ref=<reference>, read back from localStorage.
(function () {
  "use strict";
  Site.renderChrome("trips");
  const esc = Site.escapeHtml;
  const area = document.getElementById("confirmation-area");
  const b = Site.bookings().find((x) => x.ref === Site.param("ref"));
  if (!b) {
    area.innerHTML = '<h1>Booking not found</h1><p>We could not find that booking. <a href="trips.html">See your trips</a></p>';
    return;
  }
  document.title = "Booking " + b.ref + " confirmed – Skyway Travel";
  let details;
  if (b.kind === "flight") {
    details = "<h2>Flights</h2>" + b.flights.map((f, i) => '<div class="leg"><div class="leg-title">' + (i ? "Return" : "Outbound") +
      " · " + Inventory.longDate(f.date) + "</div>" + f.departTime + " " + esc(Site.airportLabel(f.from)) + " → " + f.arriveTime + " " +
      esc(Site.airportLabel(f.to)) + '<div class="muted">' + esc(f.airline) + " " + f.number + "</div></div>").join("") +
      "<h2>Passengers</h2><ul id=\"passenger-list\">" + b.passengers.map((x) => "<li>" + esc(x.first + " " + x.last) + "</li>").join("") +
      "</ul><p>Cabin: " + Inventory.cabin(b.cabin).label + " · Checked bags per passenger: " + b.bags +
      (b.insurance ? " · Travel insurance included" : "") + "</p>";
  } else {
    details = "<h2>Hotel</h2><div class=\"leg\"><div class=\"leg-title\">" + esc(b.hotel.name) + ", " + esc(b.hotel.city) + "</div>" +
      Inventory.longDate(b.checkin) + " → " + Inventory.longDate(b.checkout) + " · " + b.nights + " night" + (b.nights > 1 ? "s" : "") +
      " · " + b.guests + " guest" + (b.guests > 1 ? "s" : "") + " · " + b.rooms + " room" + (b.rooms > 1 ? "s" : "") +
      (b.breakfast ? " · Breakfast included" : "") + "</div><p>Lead guest: " + esc(b.guest.first + " " + b.guest.last) + "</p>";
  }
  area.innerHTML = '<div class="confirm-box"><h1>' + (b.status === "cancelled" ? "Booking cancelled" : "Booking confirmed") + "</h1>" +
    '<p>Booking reference</p><div class="reference" id="booking-reference">' + b.ref + "</div>" +
    "<p>We have sent the details to <strong>" + esc(b.email) + "</strong>.</p>" + details +
    '<p class="total-line">Total paid: <strong id="booking-total">' + Site.money(b.total) + "</strong></p>" +
    '<p><a class="btn" href="trips.html">View my trips</a> <a class="btn secondary" href="index.html">Book another trip</a></p></div>';
})();
