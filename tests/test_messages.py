"""labkit.messages: text wrapped at words, notes printed once on stdout."""

import warnings

from labkit import messages


def test_wrap_breaks_long_lines_at_spaces_only():
    text = "profiling " * 30
    wrapped = messages.wrap(text.strip(), width=40)
    lines = wrapped.split("\n")
    assert all(len(line) <= 40 for line in lines)
    assert all(word == "profiling" for line in lines for word in line.split())  # no word cut in two
    assert " ".join(lines) == text.strip()


def test_wrap_keeps_line_breaks_and_indents_bullets():
    text = "Findings:\n- " + "word " * 12 + "\n  2. " + "x" * 50
    assert messages.wrap(text, width=20).split("\n") == [
        "Findings:", "- word word word", "  word word word", "  word word word", "  word word word",
        "  2.", "     " + "x" * 50]  # a word longer than the width stays whole


def test_worded_text_prints_wrapped(capsys):
    @messages.worded
    def finding(n):
        """Doc."""
        return " ".join(["measured"] * n)

    assert finding.__doc__ == "Doc."
    text = finding(40)
    assert text == " ".join(["measured"] * 40)  # the words as written...
    printed = str(text)
    assert max(len(line) for line in printed.split("\n")) <= messages.WIDTH < len(text)  # ...printed wrapped
    assert printed.replace("\n", " ") == text
    print(text)
    assert capsys.readouterr().out == printed + "\n"


def test_a_note_prints_once_on_stdout_and_never_warns(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert messages.note("fp16 on this CPU is emulated") is True
        assert messages.note("fp16 on this CPU is emulated") is False
    captured = capsys.readouterr()
    assert captured.out == "labkit note: fp16 on this CPU is emulated\n" and captured.err == ""
    messages.forget_notes()
    assert messages.note("fp16 on this CPU is emulated") is True
