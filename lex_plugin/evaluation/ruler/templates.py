"""RULER-lite's prompt texts: the templates of RULER's tasks (NVIDIA/RULER, scripts/data/synthetic: niah.py,
variable_tracking.py, freq_words_extraction.py, common_words_extraction.py), and the word lists its keys are drawn from.
"""

__all__ = ["ADJECTIVES", "CWE_INTRO", "CWE_QUESTION", "FWE_INTRO", "FWE_QUESTION", "NEEDLE", "NEEDLE_UUID", "NIAH_INTRO",
           "NOISE", "NOUNS", "QUESTION", "QUESTION_ALL", "QUESTION_UUID", "VT_FIRST", "VT_INTRO", "VT_NEXT",
           "VT_QUESTION"]

# RULER's noise haystack (scripts/data/synthetic/niah.py)
NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the numbers afterwards.")
NEEDLE = "One of the special magic numbers for {key} is: {value}."
QUESTION = ("What is the special magic number for {key} mentioned in the provided text? "
            "The special magic number for {key} mentioned in the provided text is")
QUESTION_ALL = ("What are all the special magic numbers for {key} mentioned in the provided text? "
                "The special magic numbers for {key} mentioned in the provided text are")
# RULER writes "VAR X = 12345" and "VAR Y = VAR X"; '=' is rare in books (an unknown token for a book-trained
# vocabulary), so the assignment is written "is"
VT_FIRST = "VAR {name} is {value}."
VT_NEXT = "VAR {name} is VAR {previous}."
VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."
VT_QUESTION = ("Find all variables that are assigned the value {value} in the text above. "
               "The variables assigned the value {value} are")
FWE_INTRO = ("Read the following coded text and track the frequency of each coded word. Find the three most "
             "frequently appeared coded words.")
FWE_QUESTION = ("What are the three most frequently appeared words in the above coded text? "
                "The three most frequently appeared words are")
ADJECTIVES = ("ancient bitter calm damp eager faint gentle hollow icy jolly keen lively mellow narrow odd pale quiet "
              "rapid silent tender upper vivid wild young zealous brave cheap dusty empty fresh grand humble").split()
NOUNS = ("anchor basket candle desert engine feather garden harbor island jacket kettle ladder meadow needle orchard "
         "pencil quarry river saddle tunnel valley wagon yard zipper bridge castle dragon forest glacier hammer").split()
NEEDLE_UUID = "One of the special magic uuids for {key} is: {value}."
QUESTION_UUID = ("What is the special magic uuid for {key} mentioned in the provided text? "
                 "The special magic uuid for {key} mentioned in the provided text is")
CWE_INTRO = ("Below is a numbered list of words. In these words, some appear more often than others. "
             "Memorize the ones that appear most often.")
CWE_QUESTION = ("What are the 10 most common words in the above list? "
                "The top 10 words that appear most often in the list are")
