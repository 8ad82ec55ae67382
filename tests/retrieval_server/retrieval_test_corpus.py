"""The small hand-written corpus of the retrieval-service tests (imported by conftest and tests)."""

from __future__ import annotations

import json

RARE_TERM = "quixotrian"
# (id, title, text): fictional entities, one passage per line; RARE_TERM occurs in exactly one passage.
PASSAGES = [
    ("river-0", "Varnel River", "The Varnel River flows 240 km through Estmark into the Sallow Sea."),
    ("river-1", "Ostra River", "The Ostra is a slow river of the southern marshes, crossed by nine bridges."),
    ("town-0", "Kelbrook", "Kelbrook is a mill town on the Varnel River, known for its wool market."),
    ("town-1", "Dunmere", "Dunmere is a harbour town of the Sallow Sea with a ruined lighthouse."),
    ("town-2", "Asheford", "Asheford is a hill town famous for its cheese and its autumn horse fair."),
    ("person-0", "Ilsa Marrow", "Ilsa Marrow was a glassmaker born in Kelbrook in 1692 who founded a guild."),
    ("person-1", "Tomas Vey", "Tomas Vey was an astronomer who mapped the comets seen from Dunmere."),
    ("person-2", "Orla Finch", "Orla Finch wrote three novels about sailors lost in the Sallow Sea."),
    ("person-3", "Bram Holt", "Bram Holt was a bridge engineer who built the stone arches over the Ostra."),
    ("org-0", "Glassmakers Guild", "The Glassmakers Guild of Kelbrook trained apprentices for two centuries."),
    ("org-1", "Dunmere Observatory", "The Dunmere Observatory houses a brass telescope from 1820."),
    ("event-0", "Great Flood", "The Great Flood of 1766 drowned the lower town of Kelbrook for a month."),
    ("event-1", "Comet Year", "In the Comet Year the sky over Dunmere glowed green for eleven nights."),
    ("food-0", "Asheford Cheese", "Asheford cheese is a hard sheep cheese aged in limestone caves."),
    ("animal-0", "Marsh Heron", "The marsh heron nests in reed beds along the southern marshes."),
    ("plant-0", "Saltwort", "Saltwort is a fleshy plant of the tidal flats, once burned to make glass."),
    ("rare-0", "Quixotrian Clock", f"The {RARE_TERM} clock in Asheford chimes thirteen times at midnight."),
    ("ship-0", "Grey Gull", "The Grey Gull was a fishing ship wrecked on the rocks near Dunmere."),
    ("song-0", "Ballad of Ostra", "The Ballad of Ostra is a folk song about a ferryman and his daughter."),
    ("school-0", "Estmark College", "Estmark College teaches law, medicine and astronomy since 1701."),
]


def corpus_lines() -> list[str]:
    return [json.dumps({"id": pid, "contents": f'"{title}"\n{text}'}) for pid, title, text in PASSAGES]
