"""Question answering: the official SQuAD metric, windows and character offsets on long real
contexts for every tokenizer family, decoding (n-best, across windows, v2's null score), and
a short fine-tune through the engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.finetune import qa
from encoder_jax.interop import hf_import

from support import hf_tokenizer_dirs


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

CONTEXT = (
    'Zürich is the largest city in Switzerland and the capital of the canton of Zürich. It '
    'is located in north-central Switzerland, at the northwestern tip of Lake Zürich. The '
    'city has about 423,000 inhabitants, and the metropolitan area around 1.83 million. '
    'Zürich is a hub for railways, roads and air traffic; Zürich Airport and the main '
    'railway station are the largest and busiest in the country. Permanently settled for '
    'over 2,000 years, Zürich was founded by the Romans, who called it Turicum. During the '
    'Middle Ages the city gained the privilege of imperial immediacy, and in 1519 Huldrych '
    'Zwingli began the Swiss Reformation there. The Swiss Federal Institute of Technology '
    '(ETH Zürich), founded in 1855, counts Albert Einstein among its students; the physicist '
    'François Englert later taught nearby. Its official language is German, and the local '
    'dialect is a variant of Alemannic Swiss German called Züritüütsch.')
QUESTIONS = [  # (id, question, answer) with answers near the start, middle and end.
    ('q1', 'What is the largest city in Switzerland?', 'Zürich'),
    ('q2', 'How many people live in the city?', '423,000'),
    ('q3', 'What did the Romans call the city?', 'Turicum'),
    ('q4', 'Who began the Swiss Reformation?', 'Huldrych Zwingli'),
    ('q5', 'When was ETH Zürich founded?', '1855'),
    ('q6', 'What is the local dialect called?', 'Züritüütsch'),
]


def _examples():
  return [qa.Example(i, q, CONTEXT, [(a, CONTEXT.index(a))]) for i, q, a in QUESTIONS]


def test_official_normalisation_exact_match_and_f1():
  assert qa.normalize_answer('The  Eiffel-Tower!') == 'eiffeltower'
  assert qa.normalize_answer('an apple, a pear and the fig') == 'apple pear and fig'
  assert qa.exact('Huldrych Zwingli', 'huldrych zwingli.') == 1.0
  # pred 'Zwingli began' vs gold 'Huldrych Zwingli': 1 common token, P = R = 1/2.
  assert qa.f1('Huldrych Zwingli', 'Zwingli began') == pytest.approx(0.5)
  assert qa.f1('', '') == 1.0 and qa.f1('', 'Zürich') == 0.0 and qa.f1('Zürich', '') == 0.0
  examples = [qa.Example('a', 'q', 'c', [('Turicum', 0), ('the Turicum', 0)]),
              qa.Example('b', 'q', 'c', [])]
  m = qa.squad_metrics(examples, {'a': 'Turicum city', 'b': ''})
  assert m['exact'] == pytest.approx(50.0) and m['f1'] == pytest.approx(100 * (2 / 3 + 1) / 2)
  assert (m['HasAns_total'], m['NoAns_total'], m['NoAns_exact']) == (1, 1, 100.0)


@pytest.fixture(scope='module')
def tokenizers(tmp_path_factory):
  """Every tokenizer family a checkpoint brings: WordPiece, byte-level BPE, SentencePiece
  (through tokenizer.json and as encoder_jax's own sentencepiece kind), XLNet's frame."""
  root = tmp_path_factory.mktemp('qa_tok')
  out = {}
  for kind in ('bert', 'roberta', 'albert', 'xlnet'):
    hf_tokenizer_dirs.make_dir(kind, str(root / kind))
    out[kind] = hf_import.load_hf_dir(str(root / kind)).tokenizer
  model = hf_tokenizer_dirs._sentencepiece(  # pylint: disable=protected-access
      str(root / 'sp'), pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece='[PAD]',
      unk_piece='[UNK]', bos_piece='[CLS]', eos_piece='[SEP]', control_symbols=['[MASK]'])
  out['sentencepiece'] = tokenizer_lib.Tokenizer.from_sentencepiece(model)
  return out


@pytest.mark.parametrize('kind', ['bert', 'roberta', 'albert', 'xlnet', 'sentencepiece'])
def test_offsets_cover_the_text_exactly(tokenizers, kind):
  tok = tokenizers[kind]
  ids, spans = tok.encode_with_offsets(CONTEXT)
  assert ids == tok.encode(CONTEXT) and len(spans) == len(ids)
  assert all(0 <= a <= b <= len(CONTEXT) for a, b in spans)
  assert [a for a, _ in spans] == sorted(a for a, _ in spans)
  # Every non-space character is covered by some piece.
  covered = np.zeros(len(CONTEXT), bool)
  for a, b in spans:
    covered[a:b] = True
  assert all(covered[i] for i, ch in enumerate(CONTEXT) if not ch.isspace())


@pytest.mark.parametrize('kind', ['bert', 'roberta', 'albert', 'xlnet', 'sentencepiece'])
def test_windows_label_every_answer_and_map_it_back_exactly(tokenizers, kind):
  """Short windows (48 pieces, stride 16) over a long context: every answer is whole in some
  window, and each labelled window's start/end positions cut exactly the answer's text."""
  tok = tokenizers[kind]
  examples = _examples()
  w = qa.windows(examples, tok, max_len=48, doc_stride=16, max_query_length=16, train=True)
  assert w.answers_lost == 0
  rows_per_question = np.bincount(w.example)
  assert (rows_per_question > 2).all()  # The context really spans several windows.
  labelled = 0
  for r in range(len(w.example)):
    e = examples[w.example[r]]
    s, t = int(w.arrays['start_positions'][r]), int(w.arrays['end_positions'][r])
    if s == w.cls_position[r]:
      assert t == s and tok.id_to_piece(int(w.arrays['input_ids'][r, s])) == tok.id_to_piece(
          tok.cls_id)
      continue
    a, b = list(w.positions[r]).index(s), list(w.positions[r]).index(t)
    text = CONTEXT[w.spans[r][a][0]:w.spans[r][b][1]]
    assert qa.normalize_answer(text) == qa.normalize_answer(e.answers[0][0]), (kind, text)
    labelled += 1
  assert labelled >= len(examples)
  # Decoding logits that point at the labels gives the answers back.
  logits = np.full((len(w.example), 48, 2), -10.0, np.float32)
  for r in range(len(w.example)):
    logits[r, w.arrays['start_positions'][r], 0] = 10.0
    logits[r, w.arrays['end_positions'][r], 1] = 10.0
    logits[r, w.cls_position[r]] = -20.0  # No window prefers "no answer".
  predictions, _ = qa.decode(examples, w, logits)
  metrics = qa.squad_metrics(examples, predictions)
  assert metrics['exact'] == 100.0, predictions


def test_decode_picks_the_best_span_across_windows_and_v2_null_threshold(tokenizers):
  tok = tokenizers['bert']
  examples = _examples()[:1] + [qa.Example('none', 'Who founded Paris?', CONTEXT, [])]
  w = qa.windows(examples, tok, max_len=48, doc_stride=16, max_query_length=16)
  logits = np.zeros((len(w.example), 48, 2), np.float32)
  first = np.flatnonzero(w.example == 0)
  r = int(first[-1])  # The best span is in the question's last window.
  logits[r, w.positions[r][0], 0], logits[r, w.positions[r][1], 1] = 5.0, 5.0
  for row in np.flatnonzero(w.example == 1):
    logits[row, w.cls_position[row]] = 8.0  # Null score 16 > any span's.
  pred, diffs = qa.decode(examples, w, logits, version_2=True)
  a, b = w.spans[r][0][0], w.spans[r][1][1]
  assert pred['q1'] == CONTEXT[a:b] and pred['none'] == ''
  assert diffs['none'] > 0 > diffs['q1']
  pred, _ = qa.decode(examples, w, logits, version_2=True, null_score_threshold=100.0)
  assert pred['none'] != ''


def test_squad_json_answers_off_their_start_are_moved_or_dropped_and_counted(tmp_path, capsys):
  doc = {'data': [{'paragraphs': [{'context': CONTEXT, 'qas': [
      {'id': 'ok', 'question': 'q?', 'answers': [{'text': 'Turicum',
                                                   'answer_start': CONTEXT.index('Turicum')}]},
      {'id': 'off', 'question': 'q?', 'answers': [{'text': 'Turicum', 'answer_start': 3}]},
      {'id': 'gone', 'question': 'q?', 'answers': [{'text': 'Lutetia', 'answer_start': 3}]},
      {'id': 'v2', 'question': 'q?', 'answers': [], 'is_impossible': True}]}]}]}
  path = tmp_path / 'squad.json'
  path.write_text(json.dumps(doc))
  ex = {e.id: e for e in qa.read(f'json:{path}')}
  assert ex['off'].answers == [('Turicum', CONTEXT.index('Turicum'))]
  assert ex['gone'].answers == [('Lutetia', -1)] and ex['v2'].answers == []
  assert '1 answers were not at their answer_start' in capsys.readouterr().out
  with pytest.raises(ValueError, match="expected 'tfds:NAME:SPLIT' or 'json:PATH'"):
    qa.read('csv:/x')


@pytest.mark.slow  # A BERT directory, then a short fine-tune through the engine.
def test_fine_tune_on_squad_json_writes_predictions_and_metrics(tmp_path):
  hf_tokenizer_dirs.make_dir('bert', str(tmp_path / 'hf'))
  doc = {'version': 'v2.0', 'data': [{'paragraphs': [{'context': CONTEXT, 'qas': [
      {'id': i, 'question': q, 'answers': [{'text': a, 'answer_start': CONTEXT.index(a)}]}
      for i, q, a in QUESTIONS]}]}]}
  path = tmp_path / 'train.json'
  path.write_text(json.dumps(doc, ensure_ascii=False), encoding='utf-8')
  config = qa.qa_config(dict(hf_dir=str(tmp_path / 'hf')), f'json:{path}', f'json:{path}',
                        epochs=2, batch_size=8, learning_rate=1e-3, max_len=64,
                        doc_stride=24, max_query_length=16)
  result = qa.finetune(config, str(tmp_path / 'run'))
  assert result['train_questions'] == 6 and result['train_windows'] > 6
  assert result['train_answers_lost'] == 0
  assert 0.0 <= result['eval_exact'] <= 100.0 and 0.0 <= result['eval_f1'] <= 100.0
  assert result['eval_total'] == 6
  print(f"QA (6 questions, tiny BERT, 2 epochs): EM {result['eval_exact']:.1f} F1 "
        f"{result['eval_f1']:.1f}")
  predictions = json.load(open(tmp_path / 'run' / 'predictions.json', encoding='utf-8'))
  assert set(predictions) == {i for i, _, _ in QUESTIONS}
  assert all(p in CONTEXT for p in predictions.values())  # Cut from the context itself.
