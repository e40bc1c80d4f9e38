// Flight search form (home page). Validates the inputs and then opens flights.html with them in the
// query string. Values come back pre-filled when the user follows "Modify search".
(function () {
  "use strict";
  Site.renderChrome("flights");
  const p = Site.params();
  const form = document.getElementById("flight-form");
  form.from.innerHTML = Site.airportOptions(p.from, "Choose an airport");
  form.to.innerHTML = Site.airportOptions(p.to, "Choose an airport");
  if (p.depart) form.depart.value = p.depart;
  if (p.return) form.return.value = p.return;
  if (p.pax) form.pax.value = p.pax;
  if (p.cabin) form.cabin.value = p.cabin;
  if (p.trip === "oneway") document.getElementById("trip-oneway").checked = true;

  // The return date only applies to round trips.
  function syncTrip() {
    const oneway = document.getElementById("trip-oneway").checked;
    document.getElementById("field-return").classList.toggle("disabled", oneway);
    form.return.disabled = oneway;
  }
  form.querySelectorAll("input[name=trip]").forEach((r) => r.addEventListener("change", syncTrip));
  syncTrip();

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const trip = document.getElementById("trip-oneway").checked ? "oneway" : "round";
    const v = { trip, from: form.from.value, to: form.to.value, depart: form.depart.value, return: form.return.value,
      pax: form.pax.value.trim(), cabin: form.cabin.value };
    const errors = [];
    if (!v.from) errors.push({ field: "from", text: "Please choose where you are flying from." });
    if (!v.to) errors.push({ field: "to", text: "Please choose where you are flying to." });
    if (v.from && v.from === v.to) errors.push({ field: "to", text: "Origin and destination must be different." });
    if (!Site.isDate(v.depart)) errors.push({ field: "depart", text: "Please choose a departure date." });
    if (trip === "round") {
      if (!Site.isDate(v.return)) errors.push({ field: "return", text: "Please choose a return date." });
      else if (Site.isDate(v.depart) && v.return < v.depart) {
        errors.push({ field: "return", text: "The return date cannot be before the departure date." });
      }
    }
    if (!/^\d+$/.test(v.pax) || +v.pax < 1 || +v.pax > 9) errors.push({ field: "pax", text: "Passengers must be a number from 1 to 9." });
    Site.showErrors(document.getElementById("search-errors"), errors);
    if (errors.length) return;
    if (trip === "oneway") delete v.return;
    location.href = "flights.html?" + Site.query(v);
  });
})();
