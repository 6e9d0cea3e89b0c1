from calculet.runtime.chunking import graph_for, plan_chunks


def test_plan_covers_prompt_and_fits_context():
    for n in range(1, 300, 7):
        for start in (0, 5, 900):
            if start + n > 1024:
                continue
            pieces = plan_chunks(n, start, (16, 128), 1024)
            assert sum(pieces) == n
            pos = start
            for piece in pieces:
                s = graph_for(piece, pos, (16, 128), 1024)
                assert s is not None or piece == 1
                assert s is None or pos + s <= 1024
                pos += piece


def test_tail_of_context_falls_back_to_single_tokens():
    assert plan_chunks(4, 1020, (16, 128), 1024) == [1, 1, 1, 1]
    assert graph_for(1, 1020, (16, 128), 1024) is None
