// My trips: every booking made in this browser, with a cancel button for confirmed ones.
(function () {
  "use strict";
  const esc = Site.escapeHtml;
  const area = document.getElementById("trips-area");
  function describe(b) {
    if (b.kind === "flight") {
      const f = b.flights[0];
      return "Flight " + esc(Site.airportLabel(f.from)) + " → " + esc(Site.airportLabel(f.to)) + (b.flights.length > 1 ? " (round trip)" : "") +
        ", " + Inventory.longDate(f.date) + " · " + b.pax + " passenger" + (b.pax > 1 ? "s" : "");
    }
    return "Hotel " + esc(b.hotel.name) + ", " + esc(b.hotel.city) + ", " + Inventory.longDate(b.checkin) + " · " + b.nights + " night" +
      (b.nights > 1 ? "s" : "");
  }
  function render(note) {
    Site.renderChrome("trips");
    const list = Site.bookings();
    area.innerHTML = (note ? '<div class="notice" id="trips-message">' + note + "</div>" : "") + (list.length
      ? list.map((b) => '<article class="trip" data-ref="' + b.ref + '"><div><a class="trip-ref" href="confirmation.html?ref=' + b.ref +
        '">' + b.ref + '</a> <span class="status ' + b.status + '">' + (b.status === "cancelled" ? "Cancelled" : "Confirmed") +
        "</span><div>" + describe(b) + '</div></div><div class="trip-side"><strong>' + Site.money(b.total) + "</strong>" +
        (b.status === "confirmed" ? '<button class="btn secondary small cancel-trip" type="button">Cancel booking</button>' : "") +
        "</div></article>").join("")
      : '<div class="empty">You have no trips yet. <a href="index.html">Search for flights</a> or <a href="hotels.html">hotels</a>.</div>');
  }
  area.addEventListener("click", (ev) => {
    if (!ev.target.classList.contains("cancel-trip")) return;
    const ref = ev.target.closest("[data-ref]").dataset.ref;
    Site.saveBookings(Site.bookings().map((b) => (b.ref === ref ? Object.assign(b, { status: "cancelled" }) : b)));
    render("Booking " + ref + " has been cancelled.");
  });
  render("");
})();
