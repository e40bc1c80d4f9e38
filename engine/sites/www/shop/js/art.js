// Product drawings: one small inline SVG per product type (viewBox 0 0 120 110). "C" is replaced by
// the product's colour, so a blue bottle and a red chair look like what they are without any image
// files or network requests.
window.SHOP_ICONS = (function () {
  "use strict";
  const S = ' stroke="#333" stroke-width="2"';
  const sweater = '<path d="M38 20 L14 34 L16 92 L30 92 L34 50 L38 50 L38 98 L82 98 L82 50 L86 50 L90 92 L104 92 L106 34 L82 20 ' +
    'Q60 32 38 20 Z" fill="C"' + S + "/>";
  return {
    headphones: '<path d="M28 72 V58 a32 32 0 0 1 64 0 V72" fill="none" stroke="C" stroke-width="8"/>' +
      '<rect x="18" y="62" width="20" height="32" rx="7" fill="C"' + S + '/><rect x="82" y="62" width="20" height="32" rx="7" fill="C"' + S + "/>",
    speaker: '<rect x="36" y="16" width="48" height="82" rx="16" fill="C"' + S + '/><circle cx="60" cy="68" r="17" fill="#0004"/>' +
      '<circle cx="60" cy="36" r="7" fill="#0004"/>',
    tablet: '<rect x="28" y="12" width="64" height="88" rx="8" fill="C"' + S + '/><rect x="35" y="20" width="50" height="70" fill="#dfe9f5"/>',
    powerbank: '<rect x="34" y="18" width="52" height="80" rx="9" fill="C"' + S + '/><rect x="46" y="30" width="28" height="7" rx="2" fill="#6c6"/>' +
      '<rect x="48" y="86" width="24" height="5" rx="2" fill="#fff8"/>',
    watch: '<rect x="48" y="8" width="24" height="94" rx="6" fill="#444"/><rect x="36" y="34" width="48" height="44" rx="11" fill="C"' + S + "/>" +
      '<rect x="43" y="41" width="34" height="30" rx="6" fill="#123"/><path d="M50 58 l6 -8 l6 12 l6 -8" stroke="#6cf" stroke-width="2" fill="none"/>',
    webcam: '<circle cx="60" cy="46" r="27" fill="C"' + S + '/><circle cx="60" cy="46" r="12" fill="#223"/><circle cx="56" cy="42" r="3" fill="#fff8"/>' +
      '<path d="M46 72 L36 96 H84 L74 72 Z" fill="#666"/>',
    hub: '<rect x="20" y="40" width="76" height="30" rx="8" fill="C"' + S + '/><rect x="30" y="51" width="11" height="8" fill="#333"/>' +
      '<rect x="46" y="51" width="11" height="8" fill="#333"/><rect x="62" y="51" width="16" height="8" fill="#333"/><path d="M96 55 H112" stroke="#333" stroke-width="5"/>',
    kettle: '<path d="M34 94 L40 44 H80 L86 94 Z" fill="C"' + S + '/><path d="M40 56 L14 34" stroke="C" stroke-width="7"/>' +
      '<path d="M80 52 Q102 58 86 82" fill="none" stroke="#333" stroke-width="5"/><rect x="52" y="34" width="16" height="10" rx="3" fill="#333"/>',
    pan: '<ellipse cx="56" cy="62" rx="38" ry="24" fill="C"' + S + '/><rect x="90" y="56" width="26" height="9" rx="4" fill="#444"/>' +
      '<ellipse cx="56" cy="56" rx="30" ry="13" fill="#0003"/>',
    board: '<rect x="18" y="28" width="74" height="58" rx="10" fill="C"' + S + '/><rect x="92" y="48" width="16" height="18" rx="5" fill="C"' + S + "/>" +
      '<rect x="27" y="37" width="56" height="40" rx="6" fill="none" stroke="#0003" stroke-width="3"/>',
    plate: '<ellipse cx="60" cy="60" rx="46" ry="32" fill="C"' + S + '/><ellipse cx="60" cy="60" rx="28" ry="19" fill="none" stroke="#0002" stroke-width="4"/>',
    knife: '<path d="M10 74 L80 44 L86 58 Z" fill="C"' + S + '/><rect x="80" y="44" width="32" height="13" rx="5" fill="#5a3b22" transform="rotate(-22 80 44)"/>',
    espresso: '<rect x="26" y="14" width="68" height="22" rx="5" fill="C"' + S + '/><rect x="26" y="36" width="16" height="58" fill="C"' + S + "/>" +
      '<rect x="26" y="90" width="68" height="9" fill="C"' + S + '/><rect x="52" y="36" width="22" height="8" fill="#333"/>' +
      '<path d="M54 70 h18 v16 h-18 z" fill="#fff"' + S + "/>",
    mat: '<rect x="16" y="28" width="88" height="56" rx="7" fill="C"' + S + '/><g fill="#fff6"><circle cx="36" cy="46" r="7"/>' +
      '<circle cx="60" cy="46" r="7"/><circle cx="84" cy="46" r="7"/><circle cx="36" cy="68" r="7"/><circle cx="60" cy="68" r="7"/><circle cx="84" cy="68" r="7"/></g>',
    blanket: '<rect x="20" y="22" width="80" height="68" rx="12" fill="C"' + S + '/><path d="M20 40 H100 M20 56 H100 M20 72 H100" stroke="#0002" stroke-width="4"/>' +
      '<path d="M26 90 v8 M38 90 v8 M50 90 v8 M62 90 v8 M74 90 v8 M86 90 v8" stroke="C" stroke-width="3"/>',
    lamp: '<path d="M38 20 h44 l12 36 h-68 z" fill="C"' + S + '/><rect x="56" y="56" width="8" height="26" fill="#666"/>' +
      '<rect x="40" y="82" width="40" height="10" rx="4" fill="#666"/>',
    rug: '<rect x="16" y="28" width="88" height="58" fill="C"' + S + '/><rect x="27" y="39" width="66" height="36" fill="none" stroke="#fff8" stroke-width="3"/>' +
      '<path d="M60 44 l14 13 l-14 13 l-14 -13 z" fill="#fff6"/>',
    candle: '<rect x="38" y="46" width="44" height="50" rx="5" fill="C"' + S + '/><path d="M60 46 v-9" stroke="#333" stroke-width="2"/>' +
      '<path d="M60 18 q9 11 0 18 q-9 -7 0 -18" fill="#f5a623"/>',
    clock: '<circle cx="60" cy="56" r="40" fill="#fff" stroke="C" stroke-width="8"/><path d="M60 56 V30 M60 56 L78 66" stroke="#333" stroke-width="4"/>' +
      '<circle cx="60" cy="56" r="3" fill="#333"/>',
    cushion: '<path d="M24 26 Q60 38 96 26 Q86 58 96 92 Q60 80 24 92 Q34 58 24 26 Z" fill="C"' + S + "/>",
    plant: '<path d="M58 72 L48 18 L56 72 M62 72 L70 12 L66 72 M56 72 L34 30 L52 72 M64 72 L88 28 L68 72" fill="C" stroke="C" stroke-width="5"/>' +
      '<path d="M42 70 h36 l-6 28 h-24 z" fill="#fff"' + S + "/>",
    tent: '<path d="M12 90 L60 22 L108 90 Z" fill="C"' + S + '/><path d="M50 90 L60 60 L70 90 Z" fill="#0004"/>' +
      '<line x1="6" y1="90" x2="114" y2="90" stroke="#555" stroke-width="3"/>',
    backpack: '<rect x="32" y="24" width="56" height="74" rx="17" fill="C"' + S + '/><rect x="42" y="60" width="36" height="28" rx="7" fill="#0002"/>' +
      '<path d="M48 25 q12 -18 24 0" fill="none" stroke="#333" stroke-width="4"/>',
    bottle: '<rect x="42" y="30" width="36" height="70" rx="11" fill="C"' + S + '/><rect x="47" y="12" width="26" height="18" rx="4" fill="#333"/>',
    chair: '<path d="M28 28 H92 L86 64 H34 Z" fill="C"' + S + '/><path d="M34 64 L24 100 M86 64 L96 100 M40 64 L80 100 M80 64 L40 100" stroke="#555" stroke-width="4"/>',
    headlamp: '<ellipse cx="60" cy="58" rx="44" ry="22" fill="none" stroke="#555" stroke-width="8"/><rect x="42" y="24" width="36" height="28" rx="7" fill="C"' + S + "/>" +
      '<circle cx="60" cy="38" r="9" fill="#ffe680"/>',
    sleepingbag: '<path d="M40 12 Q60 2 80 12 L88 98 Q60 106 32 98 Z" fill="C"' + S + '/><ellipse cx="60" cy="24" rx="13" ry="8" fill="#0003"/>' +
      '<path d="M36 60 Q60 66 84 60" stroke="#0003" stroke-width="3" fill="none"/>',
    stove: '<rect x="28" y="62" width="64" height="32" rx="5" fill="C"' + S + '/><path d="M36 62 L28 44 M84 62 L92 44 M60 62 V44" stroke="#333" stroke-width="4"/>' +
      '<path d="M50 58 q10 -18 20 0" fill="#4aa3ff"/>',
    sweater: sweater,
    jacket: sweater + '<path d="M60 30 V98" stroke="#333" stroke-width="2"/><path d="M44 22 Q60 6 76 22" fill="C"' + S + "/>",
    tshirt: '<path d="M38 22 L18 34 L27 52 L38 46 L38 96 L82 96 L82 46 L93 52 L102 34 L82 22 Q60 36 38 22 Z" fill="C"' + S + "/>",
    shoe: '<path d="M12 82 Q14 56 28 50 L50 52 Q62 66 84 68 Q106 72 108 86 V92 H12 Z" fill="C"' + S + '/><path d="M12 92 H108" stroke="#333" stroke-width="6"/>',
    belt: '<rect x="8" y="48" width="104" height="16" rx="4" fill="C"' + S + '/><rect x="18" y="42" width="26" height="28" rx="3" fill="none" stroke="#999" stroke-width="5"/>',
    beanie: '<path d="M26 80 Q26 24 60 24 Q94 24 94 80 Z" fill="C"' + S + '/><rect x="22" y="76" width="76" height="18" rx="6" fill="C"' + S + "/>" +
      '<circle cx="60" cy="20" r="9" fill="C"' + S + "/>",
    train: '<rect x="18" y="46" width="58" height="34" rx="4" fill="C"' + S + '/><rect x="62" y="28" width="28" height="52" rx="3" fill="C"' + S + "/>" +
      '<rect x="24" y="32" width="12" height="14" fill="#333"/><circle cx="34" cy="86" r="9" fill="#333"/><circle cx="74" cy="86" r="9" fill="#333"/>',
    gamebox: '<rect x="18" y="22" width="84" height="68" rx="4" fill="C"' + S + '/><rect x="28" y="32" width="64" height="34" fill="#fff6"/>' +
      '<path d="M40 58 l10 -16 l10 10 l10 -14 l12 20 z" fill="#fff"/><rect x="28" y="72" width="42" height="7" fill="#fff8"/>',
    puzzle: '<rect x="18" y="22" width="84" height="68" rx="4" fill="C"' + S + '/><path d="M34 60 h14 a7 7 0 1 1 10 0 h14 v-14 a7 7 0 1 0 0 -10 ' +
      'v-6 h-38 z" fill="#fff8"/>',
    plush: '<circle cx="36" cy="34" r="13" fill="C"' + S + '/><circle cx="84" cy="34" r="13" fill="C"' + S + '/><circle cx="60" cy="60" r="32" fill="C"' + S + "/>" +
      '<ellipse cx="60" cy="70" rx="15" ry="11" fill="#fff"/><circle cx="48" cy="55" r="4" fill="#222"/><circle cx="72" cy="55" r="4" fill="#222"/>' +
      '<circle cx="60" cy="67" r="3.5" fill="#222"/>',
    car: '<path d="M14 76 L22 56 H44 L56 40 H84 L96 58 L108 62 V80 H14 Z" fill="C"' + S + '/><rect x="60" y="45" width="20" height="12" fill="#cde"/>' +
      '<circle cx="36" cy="82" r="12" fill="#333"/><circle cx="88" cy="82" r="12" fill="#333"/>',
    blocks: '<rect x="20" y="54" width="36" height="36" rx="3" fill="C"' + S + '/><rect x="62" y="54" width="36" height="36" rx="3" fill="C"' + S + "/>" +
      '<rect x="41" y="18" width="36" height="36" rx="3" fill="C"' + S + '/><circle cx="59" cy="36" r="6" fill="#fff8"/>',
  };
})();
