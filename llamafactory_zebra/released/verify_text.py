"""Plain English prose for ``llamafactory-zebra verify`` (written for this project; free to reuse).

Ordinary narrative and expository sentences: any competent language model predicts them well, so a
wrong attention convention shows up as a much higher perplexity.
"""

VERIFY_TEXT = """\
The old lighthouse stood at the end of a narrow spit of land, where the river met the sea. For more than a \
hundred years its keepers had climbed the same spiral stair each evening to light the lamp, and each morning \
they had climbed it again to put the flame out and polish the glass. The work was plain and often lonely, but \
the ships that passed in the night depended on it, and the keepers knew that a single careless evening could \
cost many lives.

In the spring the fishing boats returned to the harbour, and the village woke from its long winter. Nets were \
mended on the quay, the baker opened his shop before dawn, and children ran along the beach looking for shells \
that the storms had left behind. The school teacher, a patient woman who had lived in the village all her life, \
took her pupils to the lighthouse every year so that they could see how the great lens turned and how the light \
was sent far out across the water.

Scientists who study the weather often say that the sea remembers. Warm water holds its heat for months, and the \
currents carry that heat from one part of the world to another. When the surface of the ocean is warmer than \
usual, the air above it rises, clouds form, and rain falls on lands that may be thousands of miles away. Farmers \
who have never seen the ocean may still find that their harvest depends on it.

A good library is a quiet place, but it is never an empty one. Every shelf holds the voices of people who wanted \
to explain something, to remember something, or simply to tell a story. Some of the books are read every week, \
while others wait for years until the right reader comes along. The librarian does not know which book will \
change a life, and so she keeps them all, dusts them, and puts them back in their proper places.

When the evening came, the keeper walked slowly up the stair once more. He lit the lamp, checked the clockwork \
that turned the lens, and stood for a while at the window. Far out on the water he could see the lights of a \
small boat heading home. He watched until it reached the harbour safely, and then he sat down at his table to \
write the date, the weather, and the hour in the log, as every keeper before him had done.
"""
