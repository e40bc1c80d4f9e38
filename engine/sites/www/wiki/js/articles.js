// Lexica article data. Markup inside text: [[Title]] or [[Title|label]] links to another article
// (rendered as plain red text when no such article exists), **bold**, blank line = new paragraph.
// Each article: title, kind (selects the infobox picture), categories, infobox rows, lead, sections.
window.WIKI_ARTICLES = [
  // ---------------------------------------------------------------- cities
  {
    title: "Paris",
    kind: "city",
    edited: "14 February 2026",
    categories: ["Cities", "Capital cities", "Cities in Europe"],
    caption: "The Seine flowing through central Paris",
    infobox: [
      ["Country", "France"], ["Region", "Île-de-France"], ["Population (2023)", "2,102,650"],
      ["Area", "105.4 km²"], ["Elevation", "35 m"], ["River", "Seine"], ["Founded", "3rd century BC (as Lutetia)"],
      ["Time zone", "UTC+01:00 (CET)"],
    ],
    lead: `**Paris** is the capital and largest city of France. With an estimated population of 2,102,650 residents in January 2023 in an area of more than 105 km², it is the fourth-most populous city in the European Union. Since the 17th century Paris has been one of the world's major centres of finance, diplomacy, commerce, culture, fashion and gastronomy.`,
    sections: [
      ["History", `The area was settled by a Celtic people called the Parisii, who gave the city its name. The Romans conquered the settlement in 52 BC and called it Lutetia. By the 12th century Paris was the largest city in the western world, and its university attracted scholars from across Europe.

In the 19th century the prefect Georges-Eugène Haussmann rebuilt much of the centre with broad boulevards and uniform stone buildings. Paris hosted the Universal Exposition of 1889, for which the Eiffel Tower was built.`],
      ["Science and education", `Paris has long been a centre of research. [[Marie Curie]] carried out her work on radioactivity at the University of Paris, where she became the first woman to hold a professorship. The crystallographer [[Rosalind Franklin]] also worked in the city from 1947 to 1950, and the young [[Nikola Tesla]] was employed by the Continental Edison Company there in 1882.`],
      ["Transport", `The Paris Métro opened in 1900 and now has 16 lines. Cycling has grown rapidly since the 2000s; the city's bike-sharing scheme, Vélib', was one of the first large systems of its kind (see [[Bicycle]]).`],
    ],
    seeAlso: ["Vienna", "Marie Curie"],
  },
  {
    title: "Tokyo",
    kind: "city",
    edited: "2 March 2026",
    categories: ["Cities", "Capital cities", "Cities in Asia"],
    caption: "Skyline of the Shinjuku ward at dusk",
    infobox: [
      ["Country", "Japan"], ["Region", "Kantō"], ["Population (2023)", "14,094,034"], ["Area", "2,194 km²"],
      ["Former name", "Edo"], ["Capital since", "1868"], ["Time zone", "UTC+09:00 (JST)"],
    ],
    lead: `**Tokyo**, officially the Tokyo Metropolis, is the capital of Japan and one of the most populous urban areas in the world. The metropolis had a population of about 14.1 million in 2023, while the wider Greater Tokyo Area is home to more than 37 million people.`,
    sections: [
      ["History", `Tokyo was originally a fishing village named Edo. It became the seat of the Tokugawa shogunate in 1603 and grew into one of the largest cities in the world. When the shogunate ended in 1868, the imperial capital moved from Kyoto to Edo, which was renamed Tokyo, meaning "eastern capital".

Much of the city was destroyed by the Great Kantō earthquake of 1923 and again by air raids in 1945. It was rebuilt rapidly and hosted the Summer Olympic Games in 1964 and 2021.`],
      ["Transport", `Japan's first railway, powered by a [[Steam engine|steam locomotive]], opened in 1872 between Shimbashi in Tokyo and Yokohama. Today Tokyo has one of the busiest rail networks in the world, and Shinjuku Station handles more than three million passengers a day. The [[Bicycle]] is also a common way to reach local stations.`],
    ],
    seeAlso: ["Sydney"],
  },
  {
    title: "Cairo",
    kind: "city",
    edited: "20 January 2026",
    categories: ["Cities", "Capital cities", "Cities in Africa"],
    caption: "Minarets of Islamic Cairo",
    infobox: [
      ["Country", "Egypt"], ["Population (2021)", "10,100,166"], ["Area", "3,085 km²"], ["River", "Nile"],
      ["Founded", "969 AD"], ["Time zone", "UTC+02:00 (EET)"],
    ],
    lead: `**Cairo** is the capital and largest city of Egypt. Located on the banks of the [[Nile]] just south of its delta, the city has a population of more than ten million, and its metropolitan area is the largest in Africa and the Arab world.`,
    sections: [
      ["History", `The area around Cairo has been settled for thousands of years, close to the ancient capital Memphis and the pyramids of Giza. The city itself was founded in 969 AD by the Fatimid dynasty, which named it al-Qāhira, "the Victorious". Its historic centre, known as Islamic Cairo, was listed as a World Heritage Site in 1979.`],
      ["Geography", `Cairo lies on both banks of the Nile and on two islands in the river, Gezira and Roda. The climate is a hot desert climate: rain falls on only a few days a year, and summer temperatures regularly exceed 35 °C.`],
      ["Culture", `The Egyptian Museum in Tahrir Square holds one of the world's largest collections of ancient Egyptian antiquities. Al-Azhar University, founded around 970, is among the oldest continuously operating universities in the world.`],
    ],
    seeAlso: ["Nile"],
  },
  {
    title: "Sydney",
    kind: "city",
    edited: "9 December 2025",
    categories: ["Cities", "Cities in Oceania"],
    caption: "The Sydney Opera House and Harbour Bridge",
    infobox: [
      ["Country", "Australia"], ["State", "New South Wales"], ["Population (2023)", "5,450,496"], ["Area", "12,368 km²"],
      ["Founded", "26 January 1788"], ["Time zone", "UTC+10:00 (AEST)"],
    ],
    lead: `**Sydney** is the capital of the state of New South Wales and the most populous city in Australia. It lies on the country's east coast around Port Jackson, one of the largest natural harbours in the world, and had about 5.45 million inhabitants in 2023.`,
    sections: [
      ["History", `Aboriginal Australians have lived in the Sydney area for at least 30,000 years. The First Fleet of British ships arrived on 26 January 1788 and founded a penal colony at Sydney Cove. [[Charles Darwin]] visited the town in January 1836 during the voyage of HMS Beagle.`],
      ["Landmarks", `The Sydney Harbour Bridge opened in 1932. The Sydney Opera House, designed by the Danish architect Jørn Utzon, opened in 1973 and was listed as a World Heritage Site in 2007.`],
      ["Wildlife", `Humpback whales and the occasional [[Blue whale]] pass the Sydney headlands during their annual migrations. The [[Red fox]], introduced to Australia in the 19th century, is now a pest in the city's bushland.`],
    ],
    seeAlso: ["Tokyo"],
  },
  {
    title: "Reykjavík",
    kind: "city",
    edited: "30 January 2026",
    categories: ["Cities", "Capital cities", "Cities in Europe"],
    caption: "Hallgrímskirkja church above the old town",
    infobox: [
      ["Country", "Iceland"], ["Population (2024)", "139,875"], ["Area", "273 km²"], ["Founded", "874 (traditional)"],
      ["Latitude", "64°08′ N"], ["Time zone", "UTC+00:00 (GMT)"],
    ],
    lead: `**Reykjavík** is the capital and largest city of Iceland. At a latitude of 64°08′ N it is the northernmost capital of a sovereign state. The city had about 140,000 inhabitants in 2024, and roughly two thirds of Iceland's population live in the capital region.`,
    sections: [
      ["History", `According to tradition, the first permanent settler of Iceland, Ingólfur Arnarson, made his home at Reykjavík in 874. The name means "smoky bay", after the steam rising from hot springs. Reykjavík received a trade charter in 1786 and became the capital of independent Iceland in 1944.`],
      ["Energy", `Almost all homes in the city are heated with geothermal water piped from nearby hot springs, and the city's electricity comes from hydroelectric and geothermal plants.`],
      ["Tourism", `Whale-watching tours leave the old harbour all year round; minke whales and humpback whales are common, and the [[Blue whale]] is sometimes seen in summer.`],
    ],
    seeAlso: ["Vienna"],
  },
  {
    title: "Buenos Aires",
    kind: "city",
    edited: "11 November 2025",
    categories: ["Cities", "Capital cities", "Cities in South America"],
    caption: "The Obelisco on Avenida 9 de Julio",
    infobox: [
      ["Country", "Argentina"], ["Population (2022)", "3,121,707"], ["Area", "203 km²"],
      ["Founded", "2 February 1536; refounded 11 June 1580"], ["River", "Río de la Plata"], ["Time zone", "UTC−03:00 (ART)"],
    ],
    lead: `**Buenos Aires** is the capital and largest city of Argentina. The city lies on the western shore of the Río de la Plata and had 3.1 million inhabitants in 2022; its metropolitan area, Greater Buenos Aires, is home to more than 15 million people.`,
    sections: [
      ["History", `The Spanish explorer Pedro de Mendoza founded a first settlement in 1536, but it was abandoned five years later. Juan de Garay refounded the city on 11 June 1580. In 1833 [[Charles Darwin]] travelled through the region while HMS Beagle surveyed the coast.`],
      ["Culture", `Buenos Aires is known as the birthplace of the tango, which developed in its port neighbourhoods at the end of the 19th century. The Teatro Colón, opened in 1908, is considered one of the finest opera houses in the world.`],
    ],
    seeAlso: ["Amazon River"],
  },
  {
    title: "Vienna",
    kind: "city",
    edited: "5 March 2026",
    categories: ["Cities", "Capital cities", "Cities in Europe"],
    caption: "St. Stephen's Cathedral in the historic centre",
    infobox: [
      ["Country", "Austria"], ["Population (2024)", "2,005,760"], ["Area", "414.8 km²"], ["River", "Danube"],
      ["Elevation", "151 m"], ["Time zone", "UTC+01:00 (CET)"],
    ],
    lead: `**Vienna** is the capital and most populous city of Austria, with just over two million inhabitants in 2024. It lies on the Danube in the east of the country and was for centuries the seat of the Habsburg monarchy.`,
    sections: [
      ["History", `Vienna grew from the Roman camp of Vindobona. It became the residence of the Habsburg dynasty and withstood Ottoman sieges in 1529 and 1683. In the 18th and 19th centuries the city was the home of composers such as Mozart, Beethoven and Schubert.`],
      ["Culture and science", `The University of Vienna, founded in 1365, is the oldest university in the German-speaking world. The historic centre became a World Heritage Site in 2001. Like [[Paris]], Vienna is famous for its cafés, which UNESCO lists as intangible cultural heritage.`],
    ],
    seeAlso: ["Paris", "Reykjavík"],
  },

  // ---------------------------------------------------------------- scientists
  {
    title: "Marie Curie",
    kind: "person",
    edited: "1 March 2026",
    categories: ["Scientists", "Physicists", "Chemists", "Nobel laureates", "Women in science"],
    caption: "Marie Curie in her laboratory, about 1920",
    infobox: [
      ["Born", "7 November 1867, Warsaw, Congress Poland"], ["Died", "4 July 1934 (aged 66), Passy, France"],
      ["Nationality", "Polish, French"], ["Fields", "Physics, chemistry"],
      ["Known for", "Research on radioactivity; discovery of polonium and radium"],
      ["Awards", "Nobel Prize in Physics (1903); Nobel Prize in Chemistry (1911)"], ["Spouse", "Pierre Curie"],
    ],
    lead: `**Marie Salomea Skłodowska-Curie** (7 November 1867 – 4 July 1934) was a Polish and naturalised-French physicist and chemist who conducted pioneering research on radioactivity. She was the first woman to win a Nobel Prize, the first person to win a Nobel Prize twice, and the only person to win Nobel Prizes in two different sciences.`,
    sections: [
      ["Early life", `Maria Skłodowska was born in Warsaw, the youngest of five children of two teachers. Women could not attend university in Russian-ruled Poland, so she studied at the clandestine "Flying University" before moving to [[Paris]] in 1891 to study physics and mathematics at the Sorbonne.`],
      ["Research", `In 1895 she married the physicist Pierre Curie. Working together in a converted shed, they announced the discovery of two new elements in 1898: polonium, named after her native Poland, and radium. She shared the 1903 Nobel Prize in Physics with Pierre Curie and Henri Becquerel, and received the 1911 Nobel Prize in Chemistry alone.`],
      ["Later years", `During the First World War she developed mobile X-ray units, known as "petites Curies", to help surgeons treat wounded soldiers. She died in 1934 of aplastic anaemia, probably caused by long exposure to radiation.`],
    ],
    seeAlso: ["Rosalind Franklin", "Paris"],
  },
  {
    title: "Isaac Newton",
    kind: "person",
    edited: "22 February 2026",
    categories: ["Scientists", "Physicists", "Mathematicians", "British scientists"],
    caption: "Portrait of Newton painted in 1689",
    infobox: [
      ["Born", "25 December 1642, Woolsthorpe, Lincolnshire, England"], ["Died", "20 March 1727 (aged 84), Kensington, London"],
      ["Fields", "Physics, mathematics, astronomy"], ["Known for", "Laws of motion; universal gravitation; calculus; reflecting telescope"],
      ["Notable work", "Philosophiæ Naturalis Principia Mathematica (1687)"], ["Institution", "University of Cambridge"],
    ],
    lead: `**Sir Isaac Newton** (25 December 1642 – 20 March 1727) was an English mathematician, physicist and astronomer who is widely recognised as one of the most influential scientists of all time. His book Philosophiæ Naturalis Principia Mathematica, first published in 1687, set out the laws of motion and universal gravitation.`,
    sections: [
      ["Early life", `Newton was born at Woolsthorpe Manor in Lincolnshire in the year that [[Galileo Galilei]] died. He entered Trinity College, Cambridge, in 1661. When the university closed because of the plague in 1665–1666, he returned home and developed early forms of calculus and his theory of colours.`],
      ["Optics", `Newton showed that white light is made of a spectrum of colours. In 1668 he built the first practical reflecting [[Telescope]], which used a mirror instead of a lens and avoided the colour fringes of earlier instruments.`],
      ["Later life", `Newton became Warden of the Royal Mint in 1696 and its Master in 1699. He was President of the Royal Society from 1703 until his death and was knighted by Queen Anne in 1705.`],
    ],
    seeAlso: ["Galileo Galilei", "Telescope"],
  },
  {
    title: "Ada Lovelace",
    kind: "person",
    edited: "10 December 2025",
    categories: ["Scientists", "Mathematicians", "Women in science", "British scientists"],
    caption: "Watercolour portrait, about 1840",
    infobox: [
      ["Born", "10 December 1815, London, England"], ["Died", "27 November 1852 (aged 36), London, England"],
      ["Fields", "Mathematics, computing"], ["Known for", "Notes on the Analytical Engine; first published computer program"],
      ["Parents", "Lord Byron, Anne Isabella Milbanke"],
    ],
    lead: `**Augusta Ada King, Countess of Lovelace** (10 December 1815 – 27 November 1852) was an English mathematician and writer, chiefly known for her work on Charles Babbage's proposed mechanical general-purpose computer, the Analytical Engine. She is often regarded as the first computer programmer.`,
    sections: [
      ["Early life", `Ada was the only legitimate child of the poet Lord Byron and the mathematician Anne Isabella Milbanke. Her mother encouraged her interest in mathematics and logic. She met Charles Babbage in 1833 and became fascinated by his Difference Engine.`],
      ["The Analytical Engine", `In 1843 Lovelace translated an article on the Analytical Engine by the Italian engineer Luigi Menabrea and added her own notes, which were three times longer than the article. Note G describes an algorithm for computing Bernoulli numbers with the engine. Babbage planned to power the machine with a [[Steam engine]].

She foresaw that such machines might one day compose music or manipulate any symbols, not only numbers. The programming language Ada, created in 1980, is named after her, and Ada Lovelace Day is celebrated on the second Tuesday of October.`],
    ],
    seeAlso: ["Isaac Newton"],
  },
  {
    title: "Charles Darwin",
    kind: "person",
    edited: "12 February 2026",
    categories: ["Scientists", "Naturalists", "British scientists"],
    caption: "Darwin photographed in 1868",
    infobox: [
      ["Born", "12 February 1809, Shrewsbury, England"], ["Died", "19 April 1882 (aged 73), Downe, Kent, England"],
      ["Fields", "Natural history, geology, biology"], ["Known for", "Theory of evolution by natural selection"],
      ["Notable work", "On the Origin of Species (1859)"], ["Voyage", "HMS Beagle, 1831–1836"],
    ],
    lead: `**Charles Robert Darwin** (12 February 1809 – 19 April 1882) was an English naturalist, geologist and biologist, best known for his contributions to evolutionary biology. His proposition that all species descend from common ancestors is now generally accepted, and his book On the Origin of Species (1859) introduced the theory of evolution by natural selection.`,
    sections: [
      ["The voyage of the Beagle", `In December 1831 Darwin set out on HMS Beagle on a survey expedition that lasted almost five years. He spent most of the time on land, collecting fossils in Patagonia, crossing the pampas near [[Buenos Aires]] in 1833 and studying the finches and tortoises of the Galápagos Islands in 1835. On the way home the ship called at [[Sydney]] in January 1836.`],
      ["Natural selection", `Back in England, Darwin developed his theory over two decades. He was prompted to publish when Alfred Russel Wallace sent him an essay describing the same idea; their joint paper was read in 1858, and On the Origin of Species followed on 24 November 1859. Darwin was fascinated by the hexagonal cells built by the [[Honey bee]], which he described as perfect for saving wax.`],
      ["Legacy", `Darwin is buried in Westminster Abbey, close to [[Isaac Newton]]. His portrait appeared on the British ten-pound note from 2000 to 2018.`],
    ],
    seeAlso: ["Honey bee"],
  },
  {
    title: "Nikola Tesla",
    kind: "person",
    edited: "3 January 2026",
    categories: ["Scientists", "Physicists", "Inventors"],
    caption: "Tesla aged about 34",
    infobox: [
      ["Born", "10 July 1856, Smiljan, Austrian Empire (now Croatia)"], ["Died", "7 January 1943 (aged 86), New York City, U.S."],
      ["Fields", "Electrical engineering, mechanical engineering"],
      ["Known for", "Alternating current induction motor; Tesla coil; polyphase systems"], ["Patents", "About 300 worldwide"],
    ],
    lead: `**Nikola Tesla** (10 July 1856 – 7 January 1943) was a Serbian-American engineer and inventor best known for his contributions to the design of the modern alternating current (AC) electricity supply system. The SI unit of magnetic flux density, the tesla, is named after him.`,
    sections: [
      ["Early career", `Tesla studied engineering in Graz but did not graduate. In 1882 he worked for the Continental Edison Company in [[Paris]], and in 1884 he emigrated to the United States, where he briefly worked for Thomas Edison, the developer of a practical [[Incandescent light bulb]].`],
      ["Alternating current", `In 1888 Tesla licensed his AC induction motor patents to George Westinghouse. The "war of the currents" with Edison's direct-current system ended in favour of AC, which lit the 1893 World's Columbian Exposition in Chicago and powered the Niagara Falls hydroelectric plant from 1895.`],
      ["Radio", `Tesla demonstrated wireless control of a model boat in 1898 and held several patents on radio circuits. In 1943, shortly after his death, the U.S. Supreme Court upheld a decision that invalidated key patents of Guglielmo Marconi in favour of earlier work, including Tesla's (see [[Radio]]).`],
    ],
    seeAlso: ["Radio", "Incandescent light bulb"],
  },
  {
    title: "Rosalind Franklin",
    kind: "person",
    edited: "25 February 2026",
    categories: ["Scientists", "Chemists", "Women in science", "British scientists"],
    caption: "Franklin in 1955",
    infobox: [
      ["Born", "25 July 1920, Notting Hill, London, England"], ["Died", "16 April 1958 (aged 37), Chelsea, London, England"],
      ["Fields", "Chemistry, X-ray crystallography"], ["Known for", "Photo 51; structure of DNA, coal and viruses"],
      ["Institutions", "King's College London; Birkbeck College"],
    ],
    lead: `**Rosalind Elsie Franklin** (25 July 1920 – 16 April 1958) was a British chemist and X-ray crystallographer whose work was central to understanding the molecular structures of DNA, RNA, viruses, coal and graphite.`,
    sections: [
      ["Career", `After studying at Newnham College, Cambridge, Franklin researched the structure of coal during the Second World War. From 1947 to 1950 she worked in [[Paris]] at the Laboratoire central des services chimiques de l'État, where she learned X-ray diffraction techniques.`],
      ["DNA", `At King's College London, Franklin and her student Raymond Gosling took the X-ray diffraction image known as Photo 51 in May 1952. Without her knowledge the image was shown to James Watson, and it was key evidence for the double-helix model published by Watson and Francis Crick in 1953.`],
      ["Later work", `At Birkbeck College she led pioneering work on the structure of the tobacco mosaic virus. She died of ovarian cancer at the age of 37; the 1962 Nobel Prize for the structure of DNA went to Watson, Crick and Maurice Wilkins.`],
    ],
    seeAlso: ["Marie Curie"],
  },
  {
    title: "Galileo Galilei",
    kind: "person",
    edited: "18 January 2026",
    categories: ["Scientists", "Physicists", "Mathematicians", "Astronomers"],
    caption: "Portrait by Justus Sustermans, 1636",
    infobox: [
      ["Born", "15 February 1564, Pisa, Duchy of Florence"], ["Died", "8 January 1642 (aged 77), Arcetri, Grand Duchy of Tuscany"],
      ["Fields", "Astronomy, physics, mathematics"], ["Known for", "Telescopic astronomy; moons of Jupiter; kinematics"],
      ["Notable work", "Sidereus Nuncius (1610)"],
    ],
    lead: `**Galileo di Vincenzo Bonaiuti de' Galilei** (15 February 1564 – 8 January 1642) was an Italian astronomer, physicist and engineer, sometimes called the father of modern science. His improvements to the [[Telescope]] and the observations he made with it changed how people saw the heavens.`,
    sections: [
      ["Astronomy", `In 1609 Galileo built his own telescopes, eventually reaching a magnification of about 30 times. In January 1610 he discovered the four largest moons of Jupiter, now called the Galilean moons, and described them in his short book Sidereus Nuncius. He also observed the phases of Venus, sunspots and the craters of the Moon.`],
      ["Trial", `Galileo's support for the Copernican view that the Earth moves around the Sun brought him into conflict with the Catholic Church. In 1633 the Roman Inquisition found him "vehemently suspect of heresy", and he spent the rest of his life under house arrest at his villa in Arcetri, near Florence.`],
      ["Legacy", `[[Isaac Newton]], born in the year Galileo died, built on his work on motion. The NASA spacecraft Galileo, launched in 1989, studied Jupiter and its moons.`],
    ],
    seeAlso: ["Isaac Newton", "Telescope"],
  },

  // ---------------------------------------------------------------- animals
  {
    title: "African bush elephant",
    kind: "animal",
    edited: "6 February 2026",
    categories: ["Animals", "Mammals", "Endangered species"],
    caption: "A bull in Etosha National Park",
    infobox: [
      ["Scientific name", "Loxodonta africana"], ["Class", "Mammalia"], ["Conservation status", "Endangered"],
      ["Shoulder height", "up to 3.2 m (males)"], ["Weight", "about 6 tonnes (males)"], ["Gestation", "about 22 months"],
      ["Lifespan", "60–70 years"],
    ],
    lead: `The **African bush elephant** (Loxodonta africana) is the largest living terrestrial animal. Fully grown males reach a shoulder height of up to 3.2 m and weigh about six tonnes. It lives in sub-Saharan Africa in habitats ranging from savannah to semi-desert.`,
    sections: [
      ["Behaviour", `Females and their young live in family herds led by the oldest female, the matriarch, while adult males usually roam alone or in loose bachelor groups. An elephant eats up to 150 kg of vegetation a day. Pregnancy lasts about 22 months, the longest of any land mammal.`],
      ["Conservation", `The species was listed as Endangered on the IUCN Red List in 2021 because of poaching for ivory and the loss of habitat. In parts of Kenya farmers protect their crops with fences hung with beehives, because elephants avoid the stings of the [[Honey bee]].`],
    ],
    seeAlso: ["Snow leopard", "Blue whale"],
  },
  {
    title: "Emperor penguin",
    kind: "animal",
    edited: "28 January 2026",
    categories: ["Animals", "Birds", "Marine animals"],
    caption: "Adults with a chick on the sea ice",
    infobox: [
      ["Scientific name", "Aptenodytes forsteri"], ["Class", "Aves"], ["Conservation status", "Near Threatened"],
      ["Height", "about 100 cm"], ["Weight", "22–45 kg"], ["Maximum dive depth", "565 m"], ["Range", "Antarctica"],
    ],
    lead: `The **emperor penguin** (Aptenodytes forsteri) is the tallest and heaviest of all living penguin species and is found only in Antarctica. Adults stand about 100 cm tall and weigh between 22 and 45 kg, depending on the season.`,
    sections: [
      ["Breeding", `Emperor penguins breed during the Antarctic winter on sea ice, often more than 50 km from open water. The female lays a single egg and returns to the sea; the male incubates it on his feet under a fold of skin for about 65 days, huddling with other males against winds of up to 200 km/h and fasting throughout.`],
      ["Diving", `The species dives deeper than any other bird, with recorded dives of 565 m and lasting up to 22 minutes. It feeds mainly on fish, krill and squid, sharing its feeding grounds with baleen whales such as the [[Blue whale]].`],
      ["Status", `Because it depends on stable sea ice, the emperor penguin is listed as Near Threatened, and scientists expect climate change to reduce its numbers considerably by 2100.`],
    ],
    seeAlso: ["Blue whale"],
  },
  {
    title: "Red fox",
    kind: "animal",
    edited: "15 December 2025",
    categories: ["Animals", "Mammals"],
    caption: "A red fox in a meadow in England",
    infobox: [
      ["Scientific name", "Vulpes vulpes"], ["Class", "Mammalia"], ["Conservation status", "Least Concern"],
      ["Body length", "45–90 cm"], ["Weight", "2.2–14 kg"], ["Range", "Northern Hemisphere; introduced to Australia"],
    ],
    lead: `The **red fox** (Vulpes vulpes) is the largest of the true foxes and has the widest geographic range of any member of the order Carnivora, occurring across the Northern Hemisphere from the Arctic Circle to North Africa, Central America and Asia.`,
    sections: [
      ["Description", `Red foxes usually have reddish-orange fur with white undersides and black "stockings" on their legs, although silver and cross-coloured forms also occur. Their long bushy tail, called a brush, often has a white tip.`],
      ["Behaviour", `Foxes are mostly active at dusk and at night. They eat small rodents, rabbits, birds, fruit and human food waste, and are known for pouncing on prey hidden under snow. Many foxes now live in cities, including London and [[Sydney]].`],
      ["In Australia", `The red fox was introduced to Australia in the 1830s and 1870s for sport hunting. It spread across most of the continent and has contributed to the decline or extinction of many small native mammals.`],
    ],
    seeAlso: ["Snow leopard"],
  },
  {
    title: "Blue whale",
    kind: "animal",
    edited: "4 March 2026",
    categories: ["Animals", "Mammals", "Marine animals", "Endangered species"],
    caption: "A blue whale surfacing off California",
    infobox: [
      ["Scientific name", "Balaenoptera musculus"], ["Class", "Mammalia"], ["Conservation status", "Endangered"],
      ["Length", "up to 29.9 m"], ["Weight", "up to 199 tonnes"], ["Lifespan", "80–90 years"],
    ],
    lead: `The **blue whale** (Balaenoptera musculus) is a marine mammal and a baleen whale. Reaching a maximum confirmed length of 29.9 m and weighing up to 199 tonnes, it is the largest animal known ever to have existed.`,
    sections: [
      ["Feeding", `Blue whales feed almost exclusively on krill. During the feeding season an adult can eat up to 16 tonnes of krill a day by lunging into swarms with its mouth open and filtering the water through its baleen plates.`],
      ["Population", `Blue whales were abundant in nearly all oceans until commercial whaling in the 20th century reduced them to near extinction; about 360,000 were killed between 1900 and the 1960s. They have been protected since 1966, and the global population is now estimated at 5,000 to 15,000 animals.`],
      ["Sightings", `Blue whales can be seen on whale-watching trips from places such as Monterey in California, southern Sri Lanka and, in summer, [[Reykjavík]].`],
    ],
    seeAlso: ["Emperor penguin", "Common octopus"],
  },
  {
    title: "Honey bee",
    kind: "animal",
    edited: "7 March 2026",
    categories: ["Animals", "Insects"],
    caption: "A worker bee collecting pollen",
    infobox: [
      ["Scientific name", "Apis mellifera (western honey bee)"], ["Class", "Insecta"], ["Colony size", "20,000–80,000 bees"],
      ["Worker lifespan", "about 6 weeks in summer"], ["Queen lifespan", "2–5 years"], ["Eggs per day", "up to 2,000"],
    ],
    lead: `A **honey bee** is a eusocial flying insect of the genus Apis, best known for building colonies with wax combs and for producing and storing honey. The western honey bee (Apis mellifera) has been domesticated for honey production and crop pollination on every continent except Antarctica.`,
    sections: [
      ["Colony life", `A colony consists of a single queen, tens of thousands of female workers and, in summer, a few hundred male drones. In peak season the queen can lay up to 2,000 eggs a day. Workers build hexagonal wax cells, a shape that [[Charles Darwin]] admired for its economy.`],
      ["Communication", `Foragers tell their nestmates where to find food with the "waggle dance": the angle of the dance shows the direction relative to the Sun, and its duration shows the distance. The Austrian zoologist Karl von Frisch shared the 1973 Nobel Prize in Physiology or Medicine for decoding it.`],
      ["Importance", `Honey bees pollinate a large share of the world's fruit and vegetable crops. Beehive fences are also used in Africa to keep the [[African bush elephant]] away from farms.`],
    ],
    seeAlso: ["African bush elephant"],
  },
  {
    title: "Snow leopard",
    kind: "animal",
    edited: "19 February 2026",
    categories: ["Animals", "Mammals", "Vulnerable species"],
    caption: "A snow leopard in the Hemis National Park, India",
    infobox: [
      ["Scientific name", "Panthera uncia"], ["Class", "Mammalia"], ["Conservation status", "Vulnerable"],
      ["Weight", "22–55 kg"], ["Tail length", "80–105 cm"], ["Habitat altitude", "3,000–4,500 m"],
      ["Range", "Mountains of Central and South Asia"],
    ],
    lead: `The **snow leopard** (Panthera uncia) is a species of large cat native to the mountain ranges of Central and South Asia. It is listed as Vulnerable on the IUCN Red List because the global population is estimated at fewer than 10,000 mature individuals.`,
    sections: [
      ["Adaptations", `Its thick, smoky-grey fur with dark rosettes camouflages it on rocky slopes. Wide, fur-covered paws act like snowshoes, and its very long tail, 80 to 105 cm, helps with balance and is wrapped around the face for warmth while sleeping.`],
      ["Behaviour", `Snow leopards live at altitudes of 3,000 to 4,500 m and hunt wild sheep and goats such as the bharal and the Siberian ibex. Unlike other big cats, they cannot roar. They are solitary and are most active at dawn and dusk.`],
    ],
    seeAlso: ["Red fox", "African bush elephant"],
  },
  {
    title: "Common octopus",
    kind: "animal",
    edited: "26 November 2025",
    categories: ["Animals", "Molluscs", "Marine animals"],
    caption: "A common octopus on a reef in the Mediterranean",
    infobox: [
      ["Scientific name", "Octopus vulgaris"], ["Class", "Cephalopoda"], ["Arms", "8"], ["Hearts", "3"],
      ["Weight", "3–10 kg"], ["Lifespan", "1–2 years"],
    ],
    lead: `The **common octopus** (Octopus vulgaris) is a mollusc of the class Cephalopoda found in temperate and tropical waters around the world. It is one of the most studied octopus species and is known for its intelligence and its ability to change colour.`,
    sections: [
      ["Anatomy", `Like all octopuses it has eight arms lined with suckers, three hearts and blue, copper-based blood. It has no bones, so it can squeeze through any gap larger than its beak. Special skin cells called chromatophores let it change colour and texture in a fraction of a second.`],
      ["Intelligence", `In experiments common octopuses have learned to open screw-top jars and to find their way through mazes. About two thirds of their neurons are in their arms rather than their brain.`],
      ["Life cycle", `The common octopus lives only one to two years. A female lays up to several hundred thousand eggs in a den and guards them without eating until they hatch, dying soon afterwards.`],
    ],
    seeAlso: ["Blue whale"],
  },

  // ---------------------------------------------------------------- inventions
  {
    title: "Printing press",
    kind: "invention",
    edited: "13 January 2026",
    categories: ["Inventions", "Communication technology", "15th-century inventions"],
    caption: "A reconstruction of Gutenberg's press",
    infobox: [
      ["Inventor", "Johannes Gutenberg"], ["Date", "about 1440"], ["Place", "Mainz, Holy Roman Empire"],
      ["First major book", "Gutenberg Bible (about 1455)"], ["Copies of the Bible printed", "about 180"],
    ],
    lead: `A **printing press** is a mechanical device for applying pressure to an inked surface resting upon paper or cloth, transferring the ink. Johannes Gutenberg's movable-type printing press, developed around 1440 in Mainz, started the printing revolution in Europe.`,
    sections: [
      ["Gutenberg", `Gutenberg, a goldsmith, combined an adapted screw press with movable metal type cast in a hand mould and with oil-based inks. His most famous product, the Gutenberg Bible, was completed around 1455 in an edition of about 180 copies, of which 49 are known to survive.`],
      ["Spread", `By 1500 printing presses were operating in more than 270 cities, and the first press in [[Paris]] was set up at the Sorbonne in 1470. Printed books spread the works of scientists such as [[Galileo Galilei]] far faster than hand copying ever could.`],
    ],
    seeAlso: ["Telephone", "Radio"],
  },
  {
    title: "Telephone",
    kind: "invention",
    edited: "8 February 2026",
    categories: ["Inventions", "Communication technology", "19th-century inventions"],
    caption: "Bell's first telephone, 1876",
    infobox: [
      ["Inventor", "Alexander Graham Bell (patent)"], ["Patent", "US 174,465, granted 7 March 1876"],
      ["First call", "10 March 1876, Boston"], ["First words", "\"Mr. Watson, come here, I want to see you.\""],
    ],
    lead: `A **telephone** is a telecommunications device that lets two or more people hold a conversation when they are too far apart to hear each other directly. Alexander Graham Bell was granted the first United States patent for a telephone on 7 March 1876.`,
    sections: [
      ["Invention", `Several inventors worked on transmitting speech electrically in the 1870s, including Elisha Gray and Antonio Meucci. On 10 March 1876 in Boston, Bell spoke the first words over his device to his assistant Thomas Watson in the next room: "Mr. Watson, come here, I want to see you."`],
      ["Development", `Thomas Edison's carbon microphone of 1877 made calls much clearer, and the first commercial telephone exchange opened in New Haven, Connecticut, in 1878. Wireless communication by [[Radio]] later made mobile telephones possible.`],
    ],
    seeAlso: ["Radio", "Printing press"],
  },
  {
    title: "Steam engine",
    kind: "invention",
    edited: "27 December 2025",
    categories: ["Inventions", "Transport", "18th-century inventions"],
    caption: "A Watt beam engine in a museum",
    infobox: [
      ["First practical engine", "Thomas Newcomen, 1712"], ["Key improvement", "James Watt's separate condenser, patented 1769"],
      ["Fuel", "Coal, wood"], ["Used in", "Mines, factories, locomotives, ships"],
    ],
    lead: `A **steam engine** is a heat engine that performs mechanical work using steam as its working fluid. Steam engines powered the Industrial Revolution, driving pumps, mills, factory machines, ships and railway locomotives.`,
    sections: [
      ["History", `Thomas Newcomen's atmospheric engine of 1712 was the first commercially successful steam engine; it pumped water out of mines. James Watt's separate condenser, patented in 1769, greatly improved efficiency, and his rotative engines of the 1780s could drive factory machinery.`],
      ["Railways", `Richard Trevithick built the first working railway steam locomotive in 1804. Steam railways spread around the world during the 19th century; in Japan, the first line opened in 1872 between [[Tokyo]] and Yokohama. Charles Babbage intended his Analytical Engine, described by [[Ada Lovelace]], to be driven by steam.`],
    ],
    seeAlso: ["Bicycle"],
  },
  {
    title: "Incandescent light bulb",
    kind: "invention",
    edited: "16 January 2026",
    categories: ["Inventions", "Lighting", "19th-century inventions"],
    caption: "An early carbon-filament lamp",
    infobox: [
      ["Inventors", "Joseph Swan; Thomas Edison"], ["Date", "1878–1880"], ["Filament", "Carbon; tungsten from 1904"],
      ["Edison's first successful test", "22 October 1879, about 13.5 hours"],
    ],
    lead: `An **incandescent light bulb** produces light by heating a wire filament until it glows. Practical bulbs were developed independently by Joseph Swan in England and Thomas Edison in the United States around 1879 and lit homes and streets for more than a century.`,
    sections: [
      ["Development", `Dozens of inventors experimented with electric light in the 19th century. Swan demonstrated a carbon-filament lamp in Newcastle in 1879, and Edison's team tested a carbonised cotton-thread filament on 22 October 1879 that glowed for about 13.5 hours. Edison later found that carbonised bamboo lasted more than 1,200 hours.`],
      ["Later history", `Tungsten filaments, introduced from 1904, made bulbs brighter and longer-lasting. Alternating current systems designed by [[Nikola Tesla]] and George Westinghouse made it practical to supply electricity for lighting over long distances. Because they turn most of their energy into heat, incandescent bulbs have been phased out in many countries in favour of LED lamps.`],
    ],
    seeAlso: ["Nikola Tesla", "Telephone"],
  },
  {
    title: "Telescope",
    kind: "invention",
    edited: "23 February 2026",
    categories: ["Inventions", "Optical instruments", "17th-century inventions"],
    caption: "A replica of Newton's reflecting telescope",
    infobox: [
      ["First patent application", "Hans Lipperhey, 2 October 1608"], ["Place", "Middelburg, Dutch Republic"],
      ["Refracting telescope", "uses lenses"], ["Reflecting telescope", "uses mirrors; Isaac Newton, 1668"],
    ],
    lead: `A **telescope** is an instrument that makes distant objects appear magnified by using lenses, mirrors or both. The first known practical telescopes were refracting telescopes invented in the Netherlands at the beginning of the 17th century.`,
    sections: [
      ["History", `The spectacle maker Hans Lipperhey applied for a patent on a telescope on 2 October 1608. News spread quickly, and in 1609 [[Galileo Galilei]] built his own improved instruments and turned them to the sky, discovering the moons of Jupiter early in 1610.`],
      ["Reflecting telescopes", `Lenses bend different colours by different amounts, producing coloured fringes. In 1668 [[Isaac Newton]] solved this by building a reflecting telescope with a curved mirror. Almost all large research telescopes today are reflectors.`],
      ["Modern telescopes", `Telescopes now observe the whole electromagnetic spectrum. The Hubble Space Telescope was launched in 1990, and the James Webb Space Telescope, launched on 25 December 2021, has a primary mirror 6.5 m across.`],
    ],
    seeAlso: ["Galileo Galilei", "Isaac Newton"],
  },
  {
    title: "Bicycle",
    kind: "invention",
    edited: "2 February 2026",
    categories: ["Inventions", "Transport", "19th-century inventions"],
    caption: "A modern city bicycle",
    infobox: [
      ["Inventor", "Karl Drais (running machine)"], ["First ride", "12 June 1817, Mannheim"],
      ["Safety bicycle", "John Kemp Starley, Rover, 1885"], ["Pneumatic tyre", "John Boyd Dunlop, 1888"],
    ],
    lead: `A **bicycle** is a human-powered vehicle with two wheels attached to a frame, one behind the other. First introduced in the 19th century in Europe, bicycles now outnumber cars worldwide, with more than one billion in use.`,
    sections: [
      ["History", `The German inventor Karl Drais rode his two-wheeled "running machine", pushed along by the rider's feet, on 12 June 1817 in Mannheim. Pedals attached to the front wheel appeared in [[Paris]] in the 1860s, and the tall "penny-farthing" followed in the 1870s.`],
      ["The safety bicycle", `The Rover safety bicycle of 1885, built by John Kemp Starley, had two wheels of similar size and a chain drive to the rear wheel, the basic design still used today. John Boyd Dunlop's pneumatic tyre of 1888 made riding far more comfortable.`],
      ["Use today", `Cycling is common for commuting in many cities, including Amsterdam, Copenhagen and [[Tokyo]]. It is also a major sport, with the Tour de France first held in 1903.`],
    ],
    seeAlso: ["Steam engine"],
  },
  {
    title: "Radio",
    kind: "invention",
    edited: "10 January 2026",
    categories: ["Inventions", "Communication technology", "19th-century inventions"],
    caption: "A valve radio receiver from the 1930s",
    infobox: [
      ["Pioneers", "Guglielmo Marconi; Nikola Tesla; Jagadish Chandra Bose"], ["First radio transmissions", "Marconi, 1895"],
      ["First transatlantic signal", "12 December 1901"], ["Nobel Prize", "Marconi and Karl Ferdinand Braun, 1909"],
    ],
    lead: `**Radio** is the technology of communicating using radio waves, electromagnetic waves between 3 Hz and 300 GHz. Radio is used for broadcasting, for two-way communication, for navigation and radar, and in mobile telephones and wireless networks.`,
    sections: [
      ["Invention", `Heinrich Hertz proved the existence of radio waves in 1886–1888. Guglielmo Marconi built the first practical radio transmitters and receivers in 1895 and sent the letter "S" across the Atlantic from Cornwall to Newfoundland on 12 December 1901. Marconi shared the 1909 Nobel Prize in Physics with Karl Ferdinand Braun.`],
      ["Patent dispute", `[[Nikola Tesla]] had filed patents on tuned circuits in 1897. In 1943 the U.S. Supreme Court invalidated several of Marconi's key patents because of earlier work by Tesla, Oliver Lodge and John Stone Stone.`],
      ["Broadcasting", `Regular public broadcasting began in the early 1920s. Radio brought news and music into homes much as the [[Telephone]] had connected them a generation earlier.`],
    ],
    seeAlso: ["Telephone", "Nikola Tesla"],
  },

  // ---------------------------------------------------------------- rivers
  {
    title: "Nile",
    kind: "river",
    edited: "21 February 2026",
    categories: ["Rivers", "Rivers of Africa"],
    caption: "Feluccas on the Nile at Aswan",
    infobox: [
      ["Length", "about 6,650 km"], ["Drainage basin", "3,254,555 km²"], ["Countries", "11"],
      ["Main tributaries", "White Nile, Blue Nile, Atbara"], ["Mouth", "Mediterranean Sea"], ["Discharge", "about 2,830 m³/s"],
    ],
    lead: `The **Nile** is a major north-flowing river in northeastern Africa. At about 6,650 km it has traditionally been considered the longest river in the world, although some measurements give that title to the [[Amazon River]]. It flows into the Mediterranean Sea.`,
    sections: [
      ["Course", `The Nile has two major tributaries. The White Nile rises in the Great Lakes region of central Africa, while the Blue Nile begins at Lake Tana in Ethiopia and supplies most of the water and silt. The two meet at Khartoum, the capital of Sudan. The river's drainage basin covers eleven countries.`],
      ["History", `Ancient Egyptian civilisation depended on the annual flood, which deposited fertile silt on the fields. The Aswan High Dam, completed in 1970, ended the floods and created Lake Nasser. Today [[Cairo]] is the largest city on the river.`],
    ],
    seeAlso: ["Amazon River", "Cairo"],
  },
  {
    title: "Amazon River",
    kind: "river",
    edited: "3 March 2026",
    categories: ["Rivers", "Rivers of South America"],
    caption: "The Amazon near Manaus",
    infobox: [
      ["Length", "about 6,400 km"], ["Drainage basin", "about 7,000,000 km²"], ["Countries", "Peru, Colombia, Brazil"],
      ["Mouth", "Atlantic Ocean"], ["Discharge", "about 209,000 m³/s"],
    ],
    lead: `The **Amazon River** in South America is the largest river in the world by discharge volume of water, and the second-longest or longest river depending on how it is measured. It carries more water than the next seven largest rivers combined.`,
    sections: [
      ["Course", `The Amazon rises in the Andes of Peru and flows east across Colombia and Brazil to the Atlantic Ocean. Its drainage basin covers about seven million square kilometres, roughly 40 percent of South America, and no bridge crosses the main river along its whole length.`],
      ["Length", `Estimates of its length range from 6,400 to more than 7,000 km, depending on which headwater is counted and where the mouth is placed. It is therefore sometimes considered longer than the [[Nile]].`],
      ["Ecology", `The river flows through the Amazon rainforest, the largest tropical rainforest on Earth, and is home to more than 3,000 species of fish, including the piranha and the arapaima, as well as the Amazon river dolphin.`],
    ],
    seeAlso: ["Nile", "Buenos Aires"],
  },
];

// Short descriptions of the categories shown on category pages.
window.WIKI_CATEGORY_NOTES = {
  Cities: "Articles about cities and towns.",
  Scientists: "Biographies of people known for their scientific work.",
  Animals: "Articles about individual animal species.",
  Inventions: "Articles about inventions and technologies.",
  Rivers: "Articles about rivers.",
};
