"""Hand-written question and instruction banks for the generated workload.

They imitate the production data (medical MMLU subjects, InfoBench-style open
instructions with and without an input) closely enough that the router meets the same
surface variety it will see in service. The instruction bank deliberately includes open
instructions that look like the other tasks on the surface — ones that mention multiple
choice, shortest paths or edge lists, or end in a lettered list — because real open
instructions do, and a router must not be graded only on easy cases.
"""

from __future__ import annotations

MMLU_SUBJECTS = (
    "anatomy",
    "clinical knowledge",
    "college biology",
    "college medicine",
    "medical genetics",
    "nutrition",
    "professional medicine",
    "virology",
)

# (stem, correct answer, distractors); a stem may hold {age}, {sex}, {days}.
MMLU_QUESTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("A {age}-year-old {sex} presents to the emergency department with crushing substernal chest pain "
     "radiating to the left arm for the past 2 hours. ECG shows ST-segment elevation in leads II, III and "
     "aVF. Which coronary artery is most likely occluded?",
     "Right coronary artery",
     ("Left anterior descending artery", "Left circumflex artery", "Left main coronary artery",
      "Posterior descending branch of the left circumflex artery", "Obtuse marginal artery")),
    ("A {age}-year-old {sex} has had polyuria, polydipsia and a 6-kg weight loss over {days} days. Fasting "
     "plasma glucose is 310 mg/dL and urine ketones are positive. Which of the following is the most "
     "appropriate long-term treatment?",
     "Subcutaneous insulin",
     ("Metformin", "Dietary modification alone", "Sulfonylurea therapy", "Pioglitazone",
      "Acarbose")),
    ("Which of the following nerves innervates the deltoid muscle?",
     "Axillary nerve",
     ("Radial nerve", "Musculocutaneous nerve", "Suprascapular nerve", "Long thoracic nerve",
      "Thoracodorsal nerve")),
    ("The primary site of water-soluble vitamin B12 absorption is the",
     "terminal ileum",
     ("duodenum", "jejunum", "stomach", "ascending colon", "sigmoid colon")),
    ("A {age}-year-old {sex} is brought to the clinic because of fatigue and pallor. Laboratory studies "
     "show a hemoglobin of 8.9 g/dL, mean corpuscular volume of 68 fL and a low serum ferritin. Which of "
     "the following is the most likely cause?",
     "Iron deficiency anemia",
     ("Vitamin B12 deficiency", "Anemia of chronic disease", "Folate deficiency", "Aplastic anemia",
      "Hereditary spherocytosis")),
    ("Which of the following is the mode of inheritance of cystic fibrosis?",
     "Autosomal recessive",
     ("Autosomal dominant", "X-linked recessive", "X-linked dominant", "Mitochondrial",
      "Multifactorial")),
    ("Which of the following viruses is a DNA virus?",
     "Hepatitis B virus",
     ("Hepatitis C virus", "Influenza A virus", "Human immunodeficiency virus", "Measles virus",
      "Rotavirus")),
    ("When taking a blood pressure measurement, the cuff bladder should encircle at least what proportion "
     "of the upper arm?",
     "80%",
     ("40%", "50%", "60%", "100%", "25%")),
    ("Which of the following is the correct site for an intramuscular injection in an adult when using the "
     "ventrogluteal site?",
     "Gluteus medius",
     ("Gluteus maximus", "Vastus lateralis", "Rectus femoris", "Deltoid", "Biceps femoris")),
    ("A {age}-year-old {sex} develops a painful, swollen first metatarsophalangeal joint after a night of "
     "heavy drinking. Aspiration shows needle-shaped, negatively birefringent crystals. Which of the "
     "following drugs should be avoided for long-term prophylaxis during an acute attack?",
     "Allopurinol started during the attack",
     ("Colchicine", "Indomethacin", "Prednisone", "Naproxen", "Intra-articular triamcinolone")),
    ("Which of the following hormones is secreted by the posterior pituitary?",
     "Oxytocin",
     ("Prolactin", "Growth hormone", "Thyroid-stimulating hormone", "Adrenocorticotropic hormone",
      "Luteinizing hormone")),
    ("The recommended daily intake of dietary fibre for an adult is approximately",
     "25-30 g",
     ("5-10 g", "10-15 g", "50-60 g", "80-100 g", "1-2 g")),
    ("A {age}-year-old {sex} presents with a {days}-day history of fever, productive cough and pleuritic "
     "chest pain. Chest radiograph shows a right lower lobe consolidation. Which organism is the most "
     "common cause of this condition in the community?",
     "Streptococcus pneumoniae",
     ("Staphylococcus aureus", "Mycoplasma pneumoniae", "Klebsiella pneumoniae", "Legionella pneumophila",
      "Pseudomonas aeruginosa")),
    ("Which of the following structures passes through the foramen ovale of the skull?",
     "Mandibular division of the trigeminal nerve",
     ("Maxillary division of the trigeminal nerve", "Middle meningeal artery", "Facial nerve",
      "Internal carotid artery", "Abducens nerve")),
    ("Which enzyme is deficient in classic phenylketonuria?",
     "Phenylalanine hydroxylase",
     ("Tyrosinase", "Homogentisate oxidase", "Fumarylacetoacetate hydrolase", "Branched-chain "
      "alpha-ketoacid dehydrogenase", "Cystathionine beta-synthase")),
    ("A {age}-year-old {sex} has had episodes of palpitations, sweating and headache. Blood pressure is "
     "210/120 mm Hg during an episode. Urinary metanephrines are elevated. Which of the following should "
     "be given first before surgical removal of the tumour?",
     "Phenoxybenzamine",
     ("Propranolol", "Hydrochlorothiazide", "Lisinopril", "Spironolactone", "Furosemide")),
    ("Which of the following best describes the function of surfactant in the alveoli?",
     "It reduces surface tension and prevents alveolar collapse",
     ("It increases surface tension to aid expiration", "It traps inhaled particles",
      "It transports oxygen across the alveolar membrane", "It neutralises inhaled pathogens",
      "It stimulates the cough reflex")),
    ("Which of the following is a characteristic finding in Down syndrome?",
     "Single transverse palmar crease",
     ("Webbed neck", "Rocker-bottom feet", "Cleft lip and palate in most cases", "Microcephaly with "
      "polydactyly", "Tall stature")),
    ("Glycolysis takes place in which part of the cell?",
     "Cytoplasm",
     ("Mitochondrial matrix", "Inner mitochondrial membrane", "Nucleus", "Rough endoplasmic reticulum",
      "Golgi apparatus")),
    ("A {age}-year-old {sex} is found unresponsive with pinpoint pupils and a respiratory rate of 6/min. "
     "Which of the following is the most appropriate initial pharmacotherapy?",
     "Naloxone",
     ("Flumazenil", "Atropine", "Physostigmine", "N-acetylcysteine", "Fomepizole")),
    ("Which of the following vitamins is required for the gamma-carboxylation of clotting factors II, VII, "
     "IX and X?",
     "Vitamin K",
     ("Vitamin C", "Vitamin D", "Vitamin E", "Vitamin B6", "Vitamin A")),
    ("Which of the following is the most appropriate action when a patient's oxygen saturation falls to "
     "85% during nasogastric tube insertion?",
     "Stop the procedure and withdraw the tube",
     ("Continue inserting the tube more quickly", "Flush the tube with water", "Ask the patient to swallow",
      "Check the pH of the aspirate", "Lie the patient flat")),
    ("The HIV protein responsible for binding to the CD4 receptor on T helper cells is",
     "gp120",
     ("gp41", "p24", "reverse transcriptase", "integrase", "p17")),
    ("A {age}-year-old {sex} has a 3-month history of heat intolerance, weight loss and a diffuse goitre "
     "with a bruit. There is bilateral proptosis. Which of the following antibodies is most likely "
     "responsible?",
     "Thyroid-stimulating immunoglobulin",
     ("Anti-thyroid peroxidase antibody", "Anti-thyroglobulin antibody", "Anti-microsomal antibody",
      "Anti-nuclear antibody", "Anti-centromere antibody")),
    ("Which of the following muscles is the main muscle of inspiration at rest?",
     "Diaphragm",
     ("External intercostals", "Sternocleidomastoid", "Scalenes", "Internal intercostals",
      "Rectus abdominis")),
    ("Which of the following is true of a Barr body?",
     "It is an inactivated X chromosome",
     ("It is found in the cells of normal males", "It is an active Y chromosome",
      "It is a mitochondrial inclusion", "It is seen only in germ cells", "It contains ribosomal RNA")),
    ("A {age}-year-old {sex} has had watery diarrhoea for {days} days after returning from a trip abroad. "
     "There is no blood in the stool and no fever. Which of the following is the most likely pathogen?",
     "Enterotoxigenic Escherichia coli",
     ("Shigella dysenteriae", "Entamoeba histolytica", "Clostridioides difficile", "Salmonella typhi",
      "Campylobacter jejuni")),
    ("Which of the following minerals is a component of haemoglobin?",
     "Iron",
     ("Zinc", "Copper", "Magnesium", "Calcium", "Iodine")),
    ("The normal range of respiratory rate for a healthy adult at rest is",
     "12-20 breaths per minute",
     ("4-8 breaths per minute", "20-30 breaths per minute", "30-40 breaths per minute",
      "8-10 breaths per minute", "40-60 breaths per minute")),
    ("Which of the following antibiotics acts by inhibiting the 30S ribosomal subunit?",
     "Gentamicin",
     ("Erythromycin", "Penicillin", "Vancomycin", "Ciprofloxacin", "Clindamycin")),
    ("A {age}-year-old {sex} has sudden onset of the worst headache of their life, neck stiffness and "
     "photophobia. A CT scan of the head is normal. Which of the following is the most appropriate next "
     "step in diagnosis?",
     "Lumbar puncture",
     ("MRI of the brain", "Electroencephalography", "Repeat CT scan in one week", "Carotid duplex "
      "ultrasonography", "Start sumatriptan")),
    ("Which of the following cells produce antibodies?",
     "Plasma cells",
     ("Natural killer cells", "Neutrophils", "Cytotoxic T cells", "Macrophages", "Mast cells")),
    ("Which of the following is the main symptom of a Vitamin D deficiency in children?",
     "Rickets",
     ("Scurvy", "Beriberi", "Pellagra", "Night blindness", "Goitre")),
    ("In a pedigree, an affected father passes a trait to all of his daughters and none of his sons. "
     "Which mode of inheritance is most likely?",
     "X-linked dominant",
     ("X-linked recessive", "Autosomal dominant", "Autosomal recessive", "Y-linked", "Mitochondrial")),
    ("Which of the following is the first-line treatment for anaphylaxis?",
     "Intramuscular adrenaline",
     ("Oral antihistamine", "Intravenous hydrocortisone", "Nebulised salbutamol", "Oral prednisolone",
      "Intravenous fluids alone")),
    ("Where is the sinoatrial node located?",
     "In the wall of the right atrium near the opening of the superior vena cava",
     ("In the interventricular septum", "In the wall of the left atrium", "At the apex of the heart",
      "In the atrioventricular groove", "In the wall of the left ventricle")),
)

# (instruction, input or None); the input is what follows a blank line in the dataset rendering.
INFOBENCH_INSTRUCTIONS: tuple[tuple[str, str | None], ...] = (
    ("Write a 5-paragraph essay about the impact of social media on teenagers' mental health.", None),
    ("Generate a list of 10 creative names for a coffee shop that also sells used books.", None),
    ("Summarize the following text in two sentences.",
     "The city council voted on Tuesday to expand the bike lane network by 40 miles over the next three "
     "years. Supporters argued the plan would reduce traffic and emissions, while opponents raised "
     "concerns about the loss of parking spaces for small businesses. Funding will come from a mix of "
     "state grants and a small increase in parking fees."),
    ("Translate the following sentence into Spanish.", "The meeting has been moved to Thursday afternoon."),
    ("Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
     None),
    ("Classify the sentiment of the following product review as positive, negative or neutral.",
     "The headphones arrived on time and the sound is decent, but the ear cushions started peeling "
     "after two weeks."),
    ("Rewrite the following email so that it sounds more professional.",
     "hey, just wanted to say the report is late again. can u send it by tmrw? thx"),
    ("Explain the difference between a virus and a bacterium to a 10-year-old.", None),
    ("Create a 7-day vegetarian meal plan for a marathon runner, with breakfast, lunch and dinner.", None),
    ("Write a haiku about autumn rain.", None),
    ("Give me three tips for improving my sleep.", None),
    ("What are the pros and cons of working from home? Answer in a table.", None),
    ("Write a cover letter for a junior data analyst position at a healthcare company.", None),
    ("Correct the grammar in the following paragraph.",
     "Me and my friend goes to the park every weekends, and we plays football until it get dark."),
    ("Write a SQL query that returns the five customers with the highest total order value.",
     "Tables: customers(id, name), orders(id, customer_id, amount, created_at)"),
    ("Describe the water cycle in one sentence.", None),
    ("Convert the following recipe from imperial to metric units.",
     "2 cups flour\n1 stick butter\n1/2 cup sugar\nBake at 350°F for 25 minutes."),
    ("Brainstorm 8 ideas for a team-building activity that works for a remote team.", None),
    ("Write a short story in under 200 words about a lighthouse keeper who finds a message in a bottle.",
     None),
    ("Extract all the dates mentioned in the text below.",
     "The contract was signed on March 3, 2021, amended on 14 July 2022 and is due for renewal on "
     "2024-01-31."),
    ("Write a product description for a stainless steel water bottle that keeps drinks cold for 24 hours.",
     None),
    ("Suggest a title for the following blog post.",
     "In this post I walk through how I cut my grocery bill in half by planning meals on Sundays, "
     "buying in bulk and cooking with seasonal vegetables."),
    ("Explain what a p-value is, without using any mathematical formulas.", None),
    ("Write a polite message declining an invitation to a wedding.", None),
    ("Outline the key steps to launch a small online store.", None),
    ("Identify the logical fallacy in the following argument and explain it.",
     "Everyone I know loves this movie, so it must be the best movie of the year."),
    ("Write a limerick about a cat who learns to code.", None),
    ("Generate five interview questions for a nursing position.", None),
    ("Paraphrase the following sentence in simpler words.",
     "The committee's deliberations culminated in a unanimous endorsement of the proposal."),
    ("Write a JavaScript function that debounces another function.", None),
    ("Create a workout plan for a beginner who can train three days a week.", None),
    ("What is the capital of Australia, and why was it chosen over Sydney and Melbourne?", None),
    ("Write a tweet announcing the launch of a new budgeting app.", None),
    ("Compare renewable and non-renewable energy sources in a short paragraph.", None),
    ("Given the following table, which month had the highest sales? Explain briefly.",
     "Month | Sales\nJanuary | 1200\nFebruary | 980\nMarch | 1430\nApril | 1100"),
    ("Draft an agenda for a one-hour project kickoff meeting.", None),
    ("Write a persuasive speech encouraging students to join the school recycling programme.", None),
    ("Find the bug in the following code and fix it.",
     "def average(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(x)"),
    ("List the planets of the solar system in order of distance from the sun.", None),
    ("Write a thank-you note to a teacher who helped you prepare for an exam.", None),
    ("Explain how a bill becomes a law in the United States.", None),
    ("Provide a step-by-step guide for changing a flat tyre.", None),
    ("Turn the following bullet points into a coherent paragraph.",
     "- founded in 2015\n- 40 employees\n- makes solar-powered irrigation pumps\n"
     "- customers in 12 countries"),
    ("Write a dialogue between a customer and a barista in which the customer orders an unusual drink.",
     None),
    ("Describe the taste of a mango to someone who has never eaten one.", None),
    ("Write a regular expression that matches a valid US ZIP code, and explain each part.", None),
    ("Give a one-word answer: what is the chemical symbol for gold?", None),
    ("Create a catchy slogan for a campaign that promotes drinking water instead of soda.", None),
    ("Write an informative article about the history of the bicycle.", None),
    ("Answer the customer's question using the return policy below.",
     "Policy: Items can be returned within 30 days with a receipt. Opened electronics carry a 15% "
     "restocking fee.\nQuestion: Can I return headphones I opened last week?"),
)

# Open instructions that look like another task on the surface; the right task is still infobench.
INFOBENCH_LOOKALIKES: tuple[tuple[str, str | None], ...] = (
    ("Create three multiple choice questions about the water cycle. Give each four options and mark the "
     "correct answer.", None),
    ("Explain how Dijkstra's algorithm finds the shortest path from a source node to every other node in "
     "a weighted graph.", None),
    ("Convert the following edge list into an adjacency matrix.",
     "0 -> 1, weight: 4\n1 -> 2, weight: 7\n0 -> 2, weight: 3\n2 -> 3, weight: 1"),
    ("Rank the following programming languages from easiest to hardest for a complete beginner and "
     "justify your ranking.",
     "A. Python\nB. C++\nC. JavaScript\nD. Rust"),
    ("Which of these marketing slogans is the most memorable? Explain your choice.",
     "A) Just brew it.\nB) Wake up and smell the savings.\nC) Your morning, upgraded."),
    ("Write a multiple-choice quiz with five questions on basic first aid, and put the answers at the end.",
     None),
    ("Describe the shortest route from the central station to the museum using the map description below.",
     "The station is on Main Street. Walk north two blocks to Park Avenue, then east three blocks. The "
     "museum is on the corner of Park Avenue and 5th Street."),
    ("Explain the following instruction to a new employee in plain language.",
     "All visitors must sign in at reception and wear a badge at all times."),
    ("Draw the following graph as ASCII art.",
     "0 - 1, weight: 2\n1 - 2, weight: 5\n2 - 0, weight: 1"),
    ("Answer the question below in a friendly tone.",
     "Question: What time does the library open on Sundays?"),
)
