// Skyway Travel reference data: airports, airlines and hotel name patterns. Flights and hotels are
// generated from these by js/inventory.js, deterministically from the search inputs.
window.TRAVEL_AIRPORTS = [
  // code, city, airport name, latitude, longitude, UTC offset (hours, ignoring daylight saving)
  { code: "AMS", city: "Amsterdam", name: "Amsterdam Schiphol", lat: 52.31, lon: 4.76, tz: 1 },
  { code: "BER", city: "Berlin", name: "Berlin Brandenburg", lat: 52.36, lon: 13.5, tz: 1 },
  { code: "DXB", city: "Dubai", name: "Dubai International", lat: 25.25, lon: 55.36, tz: 4 },
  { code: "LHR", city: "London", name: "London Heathrow", lat: 51.47, lon: -0.45, tz: 0 },
  { code: "MAD", city: "Madrid", name: "Madrid Barajas", lat: 40.49, lon: -3.57, tz: 1 },
  { code: "JFK", city: "New York", name: "New York John F. Kennedy", lat: 40.64, lon: -73.78, tz: -5 },
  { code: "CDG", city: "Paris", name: "Paris Charles de Gaulle", lat: 49.01, lon: 2.55, tz: 1 },
  { code: "FCO", city: "Rome", name: "Rome Fiumicino", lat: 41.8, lon: 12.25, tz: 1 },
  { code: "SIN", city: "Singapore", name: "Singapore Changi", lat: 1.36, lon: 103.99, tz: 8 },
  { code: "SYD", city: "Sydney", name: "Sydney Kingsford Smith", lat: -33.94, lon: 151.18, tz: 10 },
  { code: "HND", city: "Tokyo", name: "Tokyo Haneda", lat: 35.55, lon: 139.78, tz: 9 },
  { code: "YYZ", city: "Toronto", name: "Toronto Pearson", lat: 43.68, lon: -79.63, tz: -5 },
];

window.TRAVEL_AIRLINES = [
  { code: "NW", name: "Northwind Airways" },
  { code: "AB", name: "Atlantic Blue" },
  { code: "MR", name: "Meridian Air" },
  { code: "PC", name: "Pacific Crest" },
  { code: "LU", name: "Lumo Air" },
  { code: "OR", name: "Orion Airlines" },
];

// Connecting hubs for one-stop flights.
window.TRAVEL_HUBS = ["AMS", "LHR", "CDG", "DXB", "SIN", "MAD"];

window.TRAVEL_CABINS = [
  { id: "economy", label: "Economy", factor: 1 },
  { id: "premium", label: "Premium economy", factor: 1.65 },
  { id: "business", label: "Business", factor: 3.4 },
  { id: "first", label: "First", factor: 5.8 },
];

// Hotel names: "{city}" is replaced by the city name. Six are picked per city.
window.TRAVEL_HOTEL_NAMES = [
  "Grand Hotel {city}", "{city} Central Inn", "The Riverside", "Hotel Lumen", "Park View Suites", "The Harbour House",
  "Maison Belle", "{city} Airport Lodge", "The Observatory Hotel", "Old Town Residence", "Skyline Tower Hotel", "Garden Court",
];
window.TRAVEL_AMENITIES = ["Free Wi-Fi", "Breakfast available", "Swimming pool", "Fitness centre", "Parking", "Spa", "Airport shuttle"];

// Fees used on the booking page (also listed on the help page).
window.TRAVEL_FEES = {
  taxesPerPassengerPerFlight: 38,
  bagPrice: 35,
  insurancePerPassenger: 24,
  breakfastPerGuestPerNight: 15,
  hotelTaxRate: 0.1,
};
