"""Texts for reference sets and perplexity: short passages in several languages and code, and the
English documentation text that ships with every Python install (`pydoc_data.topics`).

The passages were written for this project. Each is tagged with what it exercises, so a reference
set can say which kinds of text a compiled model gets wrong.
"""

from __future__ import annotations

import functools

PASSAGES: tuple[tuple[str, str], ...] = (
    ("en_prose",
     "The ferry left the harbour a little after six, when the fog was still lying low over the water. "
     "Most passengers stayed inside with their coffee, but an old man stood at the rail and watched the "
     "gulls follow the wake, as if he were counting them."),
    ("en_howto",
     "To replace a bicycle tube, first release the brake and remove the wheel. Push one side of the tyre "
     "over the rim with two levers, pull out the old tube, and check the inside of the tyre for glass or "
     "thorns before fitting the new one. Inflate it to 4.5 bar."),
    ("en_qa",
     "Question: Why is the sky blue during the day?\nAnswer: Sunlight is scattered by the molecules of "
     "the air, and short wavelengths are scattered much more strongly than long ones, so blue light "
     "reaches the eye from every direction of the sky."),
    ("fr",
     "Le marché du samedi ouvre à sept heures. On y trouve des fromages de la région, du pain encore "
     "chaud et des pommes ramassées la veille. Les habitués arrivent tôt, car les meilleures tomates "
     "partent avant neuf heures."),
    ("de",
     "Die Bibliothek der Stadt wurde im Jahr 1894 eröffnet und zweimal erweitert. Heute leihen dort "
     "jeden Monat mehr als zwölftausend Menschen Bücher aus, und im Lesesaal unter dem Glasdach ist "
     "fast immer jeder Platz besetzt."),
    ("es",
     "Cuando llegamos al pueblo, la plaza estaba llena de gente que esperaba el comienzo de la fiesta. "
     "Los niños corrían entre las mesas y, desde el balcón del ayuntamiento, una banda tocaba canciones "
     "que todos conocían de memoria."),
    ("it_pt",
     "Il treno per Firenze parte dal binario tre alle otto e un quarto. O comboio para o Porto atrasou "
     "vinte minutos por causa da chuva, mas ninguém pareceu importar-se muito."),
    ("ru",
     "Зимой озеро замерзает так крепко, что по льду можно пройти до самого острова. Рыбаки сидят у "
     "лунок с рассвета до темноты и почти не разговаривают друг с другом."),
    ("zh",
     "春天来了，公园里的樱花都开了。周末有很多人带着孩子来散步、拍照，湖边的长椅上坐满了看书和聊天的人。"
     "傍晚的时候，风有一点凉，但大家还是不愿意回家。"),
    ("ja",
     "駅から歩いて十分ほどのところに、小さな本屋があります。店主は毎朝八時に店を開け、"
     "新しく届いた本を棚に並べながら、常連のお客さんと天気の話をします。"),
    ("ko_ar_hi",
     "오늘은 비가 와서 집에서 책을 읽었습니다. يحب أخي قراءة الكتب في المساء بعد العمل. "
     "मेरी दादी हर सुबह बगीचे में पानी देती हैं।"),
    ("code_python",
     "import json\nfrom pathlib import Path\n\n\ndef load_scores(path: Path) -> dict[str, float]:\n"
     "    \"\"\"Read a JSON file of name -> score and keep the finite ones.\"\"\"\n"
     "    data = json.loads(path.read_text())\n"
     "    return {k: float(v) for k, v in data.items() if v == v and abs(v) != float('inf')}\n"),
    ("code_c",
     "#include <stdio.h>\n\nstatic unsigned gcd(unsigned a, unsigned b) {\n    while (b != 0) {\n"
     "        unsigned t = a % b;\n        a = b;\n        b = t;\n    }\n    return a;\n}\n\n"
     "int main(void) {\n    printf(\"%u\\n\", gcd(1071, 462));\n    return 0;\n}\n"),
    ("code_js_sql",
     "const total = orders.filter(o => o.status === 'paid').reduce((sum, o) => sum + o.amount, 0);\n"
     "SELECT customer_id, COUNT(*) AS n FROM orders WHERE created_at >= '2024-01-01' GROUP BY customer_id "
     "HAVING COUNT(*) > 3 ORDER BY n DESC;"),
    ("json_math",
     "{\"id\": 4182, \"name\": \"sensor-7\", \"readings\": [12.5, 12.7, 13.1], \"ok\": true}\n"
     "Let f(x) = 3x^2 - 2x + 1. Then f'(x) = 6x - 2, so f has its minimum at x = 1/3, where f(1/3) = 2/3."),
    ("list_dialogue",
     "Shopping list:\n- 2 litres of milk\n- 6 eggs\n- rice (1 kg)\n- lemons\n\n"
     "\"Did you remember the lemons?\" she asked.\n\"Of course,\" he said, and then checked the bag twice."),
)


# The passages in non-Latin scripts (Cyrillic, CJK, Hangul, Arabic, Devanagari): their tokens sit far from
# the English ones, where a coarse quantized head has been seen to rank the top token lowest.
NON_LATIN = ("ru", "zh", "ja", "ko_ar_hi")


def passage_names() -> tuple[str, ...]:
    return tuple(name for name, _ in PASSAGES)


@functools.cache
def english_docs_text() -> str:
    """The English text of the Python documentation's topics, as shipped in `pydoc_data.topics`.

    Topics are joined in sorted order so the text is the same on every run of one Python version."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions split pydoc_data out of the standard library
        raise FileNotFoundError("pydoc_data.topics is not installed with this Python; pass --text FILE") from None
    return "\n\n".join(topics[key] for key in sorted(topics))
