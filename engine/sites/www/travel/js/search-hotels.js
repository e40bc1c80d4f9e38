// Hotel search form: validates the stay and opens hotel-results.html.
(function () {
  "use strict";
  Site.renderChrome("hotels");
  const p = Site.params();
  const form = document.getElementById("hotel-form");
  form.city.innerHTML = Site.airportOptions(p.city, "Choose a city");
  if (p.checkin) form.checkin.value = p.checkin;
  if (p.checkout) form.checkout.value = p.checkout;
  if (p.guests) form.guests.value = p.guests;
  if (p.rooms) form.rooms.value = p.rooms;

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = { city: form.city.value, checkin: form.checkin.value, checkout: form.checkout.value, guests: form.guests.value.trim(),
      rooms: form.rooms.value };
    const errors = [];
    if (!v.city) errors.push({ field: "city", text: "Please choose a city." });
    if (!Site.isDate(v.checkin)) errors.push({ field: "checkin", text: "Please choose a check-in date." });
    if (!Site.isDate(v.checkout)) errors.push({ field: "checkout", text: "Please choose a check-out date." });
    if (Site.isDate(v.checkin) && Site.isDate(v.checkout)) {
      const n = Inventory.nights(v.checkin, v.checkout);
      if (n < 1) errors.push({ field: "checkout", text: "The check-out date must be after the check-in date." });
      else if (n > 30) errors.push({ field: "checkout", text: "Stays are limited to 30 nights." });
    }
    if (!/^\d+$/.test(v.guests) || +v.guests < 1 || +v.guests > 8) errors.push({ field: "guests", text: "Guests must be a number from 1 to 8." });
    else if (+v.guests < +v.rooms) errors.push({ field: "rooms", text: "Each room needs at least one guest." });
    Site.showErrors(document.getElementById("search-errors"), errors);
    if (!errors.length) location.href = "hotel-results.html?" + Site.query(v);
  });
})();
