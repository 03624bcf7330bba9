"""Example builders, looked up by ``config.data.pair_kind``.

A builder turns a stream of documents into instances. An instance is ``(pieces, label)``
where each piece is ``(tokens, start, stop, segment_id)``: a contiguous token range of a
prepared shard. Each builder declares its ``template`` (``(cls_id, sep_id) ->
tokenizer_files.Template``), and ``iterators.render`` frames every builder's rows with it:
the template's specials before the first piece, each piece closed by its separators in the
piece's own segment, then the template's trailing specials. With ``Template.bert`` that is
``[CLS] piece_1 [SEP] piece_2 [SEP] ...`` ([CLS] in segment 0): NSP/SOP pairs are two
pieces with segment ids 0 and 1, and packed sequences one piece per document with segment
id 0 and an extra [SEP] between documents; XLNet's pairs (``Template.xlnet``) are
``A [SEP] B [SEP] [CLS]``, [CLS] in segment 2. [CLS]/[SEP] stand for the tokenizer's
``cls_id``/``sep_id``: ``<s>``/``</s>`` with byte-level BPE.

Builders are generators over a ``DocumentStream`` from a cursor ``(epoch, position, sub)``
and yield ``(instance, cursor after it)``, so a consumer can stop anywhere and later
regenerate the same instances from a saved cursor. All randomness is seeded per document
(``seeding.mix(seed, DOCUMENT, epoch, document id, seq_len)``), so a document's instances do
not depend on which process builds them or where a run was resumed.

Each builder class also says whether a corpus can feed it: ``check_corpus(documents,
sentences, tokens, where) -> [warning]`` raises ValueError when it can build nothing valid
(one document of one sentence for NSP), and ``pair_labels`` says whether its labels are a
pair objective's targets (the iterator warns when its first pool has one class only).
A builder with ``packs_documents = True`` puts several documents in a row
(``packing.PackedDocuments``): each piece is framed alone, head to tail, and the arrays add
``document_ids`` [N, L], which the batches then carry.
"""

from __future__ import annotations

from encoder_jax.data.builders import nsp
from encoder_jax.data.builders import packing
from encoder_jax.data.builders import xlnet

REGISTRY = {
    'nsp': nsp.NextSentencePairs,
    'sop': nsp.SentenceOrderPairs,
    'full_sentences': packing.FullSentences,
    'doc_sentences': packing.DocSentences,
    # Unpadded rows: whole documents back to back, attention and positions per document.
    'packed_documents': packing.PackedDocuments,
    'xlnet': xlnet.XLNetPairs,  # A [SEP] B [SEP] [CLS] (XLNet's layout, segment 2 = [CLS]).
}


def make(pair_kind: str, **kwargs):
  if pair_kind not in REGISTRY:
    raise ValueError(f'config.data.pair_kind {pair_kind!r} is unknown; valid: '
                     f'{sorted(REGISTRY)}')
  return REGISTRY[pair_kind](**kwargs)
