#!/bin/sh
# Rebuilds tests/data/spm/tokenizer.model, the tiny SentencePiece model used by
# tokenizer_test and model_loader_test, and byte_fallback.model. Needs `spm_train` (Debian package
# `sentencepiece`). The training text below was written for this project and is
# dedicated to the public domain.
set -eu
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat > "$work/corpus.txt" <<'TEXT'
The river runs past the old mill and under the stone bridge.
In the morning the baker opens the shop and the town smells of bread.
A small boat carries apples, pears and plums down to the market.
Children walk to school along the river, counting the ducks.
The teacher writes numbers on the board: one, two, three, four, five.
Six, seven, eight, nine and ten are the numbers after five.
At noon the bell rings and everyone stops to eat.
The miller grinds wheat into flour; the baker turns flour into bread.
Farmers bring milk, cheese and eggs in carts pulled by horses.
When it rains the river rises and the bridge is closed for a day.
The library keeps books about ships, stars, plants and machines.
A student reads about the moon and the planets that circle the sun.
Light travels fast, but sound is much slower than light.
The clock in the tower strikes the hours from morning until night.
In winter the river freezes and people skate across the ice.
In summer the fields are green and the days are long and warm.
Bees visit the flowers and make honey in the garden behind the school.
The doctor walks from house to house with a leather bag.
A cat sleeps in the window of the bakery, warm in the sun.
The mayor speaks in the square about the new road to the coast.
Merchants from the coast bring salt, fish and cloth to sell.
Every evening the lamps are lit along the streets of the town.
The old mill has a wheel that turns with the water of the river.
A machine can count faster than a person, but it must be told what to do.
Models read tokens, one after another, and guess the next one.
Experts in a mixture each learn a part of the work, and a router chooses among them.
Each head of attention looks back over the tokens that came before.
A switch sends every token to one expert; a mixture may send it to two.
When an expert is full the token is dropped or sent to another expert.
The server answers many requests at once and streams the words back.
Numbers like 12, 345 and 6789 are written with digits.
Questions end with a question mark? Exclamations end with a mark!
Lists use commas, and some sentences use semicolons; others use colons: like this.
The quick brown fox jumps over the lazy dog near the river bank.
She sells sea shells by the sea shore, and the shells she sells are small.
How much wood would a woodchuck chuck if a woodchuck could chuck wood?
The weather today is cloudy with a chance of rain in the evening.
Tomorrow will be sunny and bright, with a gentle wind from the west.
The train leaves the station at eight and reaches the city by ten.
Passengers read, talk, sleep or watch the fields roll past the window.
A letter arrives from a friend who lives far away across the sea.
The friend writes about mountains, snow, and a village with a single road.
We write back about the river, the mill, the bakery and the school.
Good stories have a beginning, a middle and an end.
The end of this text is near, and the tokenizer has seen enough words.
TEXT

# Repeat the text so the piece statistics have some weight. (The output is
# not byte-identical between runs; the tests only rely on its behaviour.)
for i in 1 2 3 4 5 6 7 8; do cat "$work/corpus.txt"; done > "$work/train.txt"

train() {  # train MODEL_NAME VOCAB_SIZE [FLAG...]
  name=$1 vocab=$2
  shift 2
  spm_train \
    --input="$work/train.txt" \
    --model_prefix="$work/$name" \
    --vocab_size="$vocab" \
    --model_type=unigram \
    --character_coverage=1.0 \
    --normalization_rule_name=identity \
    --num_threads=1 \
    --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 \
    --minloglevel=2 "$@"
  cp "$work/$name.model" "$name.model"
  echo "wrote $(pwd)/$name.model"
}

# tokenizer.model: 300 pieces, characters outside the text are <unk>.
train tokenizer 300
# byte_fallback.model: the same with SentencePiece's 256 byte pieces, which
# spell any other character as its UTF-8 bytes (detokenizer_test).
train byte_fallback 400 --byte_fallback=true
