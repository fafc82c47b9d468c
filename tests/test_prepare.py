"""lex prepare: tokenization without escaping, document layout, BPE round trip, clear errors."""

import json

import pytest
from click.testing import CliRunner

from lex_plugin.cli import main as lex_cli
from lex_plugin.data.text import moses_tokenize, paragraphs


def test_moses_python_api_does_not_xml_escape():
    assert moses_tokenize("Tom & Jerry's <b> \"quote\"") == 'Tom & Jerry \'s < b > " quote "'


def test_paragraphs_join_wrapped_lines_and_split_on_blank_lines():
    text = "CHAPTER I\n\nIt was a  dark\nand stormy night.\n\n\n  Said he.  \n"
    assert paragraphs(text) == ["CHAPTER I", "It was a dark and stormy night.", "Said he."]


@pytest.fixture(scope="module")
def prepared(pg_slice, tmp_path_factory):
    dest = tmp_path_factory.mktemp("bin") / "data-bin"
    result = CliRunner().invoke(lex_cli, ["prepare", str(pg_slice), str(dest), "--vocab-size", "1000", "--workers", "2"])
    assert result.exit_code == 0, result.output
    return pg_slice, dest, result.output


def test_prepare_writes_a_fairseq_data_bin(prepared):
    src, dest, output = prepared
    for name in ["dict.txt", "spm.model", "lex_prepare.json", "preprocess.log"] + [
        f"{s}.{ext}" for s in ("train", "valid", "test") for ext in ("bin", "idx")
    ]:
        assert (dest / name).is_file(), name
    meta = json.loads((dest / "lex_prepare.json").read_text())
    assert meta["bpe"] == "sentencepiece" and meta["tokenizer"] == "moses"
    assert meta["splits"]["train"]["documents"] == 3
    assert "train" in output and "tokens" in output
    assert not (dest / "text").exists()  # intermediate text removed


def test_documents_are_separated_and_bpe_round_trips(prepared):
    import sentencepiece as spm
    from fairseq.data import Dictionary, data_utils

    src, dest, _ = prepared
    d = Dictionary.load(str(dest / "dict.txt"))
    train = data_utils.load_indexed_dataset(str(dest / "train"), d)
    lines = [train[i] for i in range(len(train))]
    empty = [i for i, t in enumerate(lines) if len(t) == 1 and t[0] == d.eos()]  # the blank line between documents
    assert len(empty) == 3 - 1
    sp = spm.SentencePieceProcessor(model_file=str(dest / "spm.model"))
    first_doc = sorted((src / "train").glob("*.txt"))[0].read_text(encoding="utf-8")
    first_paragraph = moses_tokenize(paragraphs(first_doc)[0])
    decoded = sp.decode(d.string(lines[0]).split())
    assert decoded == first_paragraph


def _fails(args, match):
    result = CliRunner().invoke(lex_cli, args)
    assert result.exit_code != 0
    assert match in result.output, result.output
    return result


def test_bad_inputs_give_clear_errors_and_write_nothing(tmp_path, pg_slice):
    empty = tmp_path / "empty"
    empty.mkdir()
    dest = tmp_path / "out"
    _fails(["prepare", str(empty), str(dest)], "missing split")
    assert not dest.exists()

    src = tmp_path / "corpus"
    for split in ("train", "valid", "test"):
        (src / split).mkdir(parents=True)
        (src / split / "a.txt").write_text("Some text here.\n\nMore text.\n", encoding="utf-8")
    (src / "test" / "b.txt").write_bytes("caf\xe9 latin-1".encode("latin-1"))
    _fails(["prepare", str(src), str(dest), "--vocab-size", "30"], "not UTF-8")
    assert not dest.exists()

    (src / "test" / "b.txt").unlink()
    (src / "valid" / "a.txt").unlink()
    _fails(["prepare", str(src), str(dest)], "holds no text files")
    assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no staging left behind

    dest.mkdir()
    (dest / "keep.txt").write_text("x")
    _fails(["prepare", str(pg_slice), str(dest)], "--force")
    assert (dest / "keep.txt").read_text() == "x"


def test_vocabulary_too_large_is_explained(tmp_path):
    src = tmp_path / "corpus"
    for split in ("train", "valid", "test"):
        (src / split).mkdir(parents=True)
        (src / split / "a.txt").write_text("A tiny corpus.\n", encoding="utf-8")
    _fails(["prepare", str(src), str(tmp_path / "out"), "--vocab-size", "5000"], "--vocab-size 5000 is too large")
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e  # starts a process
def test_wikitext_articles_become_documents(tmp_path):
    """WikiText-style files (here the real WikiText-2 valid/test) split into one document per article."""
    from conftest import shared_data

    wiki = shared_data() / "wikitext-2"
    src = tmp_path / "wiki"
    for split, name in (("train", "valid.txt"), ("valid", "test.txt"), ("test", "test.txt")):
        target = name.replace(".txt", ".raw") if split == "valid" else name  # WikiText-103's own suffix
        (src / split).mkdir(parents=True)
        text = (wiki / name).read_text(encoding="utf-8")
        cut = text.index("\n = ", 40_000)  # the first articles only, ending at an article boundary
        (src / split / target).write_text(text[:cut], encoding="utf-8")
    dest = tmp_path / "bin"
    result = CliRunner().invoke(lex_cli, ["prepare", str(src), str(dest), "--documents", "wikitext", "--bpe", "none",
                                          "--vocab-size", "2000", "--workers", "1"])
    assert result.exit_code == 0, result.output
    meta = json.loads((dest / "lex_prepare.json").read_text())
    train_text = (src / "train" / "valid.txt").read_text(encoding="utf-8")
    titles = [l for l in train_text.splitlines() if l.startswith(" = ") and not l.startswith(" = = ")]
    assert meta["splits"]["train"]["documents"] == len(titles) > 1
