"""ChatTemplate.ids from two threads at once: each thread renders the conversations (the second in
reverse order) `rounds` times; what each got, and any error either met."""
import threading


def ids_from_two_threads(template, convs, rounds: int):
    got, errors = {0: [], 1: []}, []

    def run(k):
        try:
            for _ in range(rounds):
                got[k].append([template.ids(m) for m in (convs if k == 0 else convs[::-1])])
        except Exception as e:  # noqa: BLE001 - reported to the caller
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return got, errors
