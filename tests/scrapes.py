"""Reading a Prometheus scrape in tests: every sample as {(name, sorted labels): value}, and sums over labels."""
from prometheus_client.parser import text_string_to_metric_families


def samples_of(text: str) -> dict:
    return {(one.name, tuple(sorted(one.labels.items()))): one.value
            for family in text_string_to_metric_families(text) for one in family.samples}


def total(samples: dict, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(value for (found, pairs), value in samples.items()
               if found == name and all(dict(pairs).get(k) == v for k, v in labels.items()))
