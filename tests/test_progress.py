"""The status line: rewritten in place on a terminal, plain lines anywhere else."""

import io

from bertlab.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_whole_lines_never_a_carriage_return():
    log = io.StringIO()
    with Progress(log, every=3600) as p:
        p.update("step 1/3")
        p.update("step 2/3")  # within the interval: not written
        p.update("step 3/3")
    assert log.getvalue() == "step 1/3\nstep 3/3\n"  # the first, then the final status


def test_a_terminal_line_is_rewritten_then_ended_before_the_next_message():
    screen = Terminal()
    with Progress(screen) as p:
        p.update("step 1/2")
        p.update("step 2/2")
    assert screen.getvalue() == "\rstep 1/2\rstep 2/2\n"


def test_nothing_is_written_when_there_was_no_status():
    log = io.StringIO()
    Progress(log).close()
    assert log.getvalue() == ""
