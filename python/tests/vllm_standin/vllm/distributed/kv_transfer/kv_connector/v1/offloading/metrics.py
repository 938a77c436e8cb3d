"""Stand-in for OffloadingConnectorStats: records what a manager reports, for comparison."""


class OffloadingConnectorStats:
    def __init__(self):
        self.gauges = {}
        self.histograms = {}
        self.counters = {}

    def set_gauge(self, name, value, labelvalues=None):
        self.gauges[(name, labelvalues)] = value

    def observe_histogram(self, name, value, labelvalues=None):
        self.histograms.setdefault((name, labelvalues), []).append(value)

    def increase_counter(self, name, value, labelvalues=None):
        key = (name, labelvalues)
        self.counters[key] = self.counters.get(key, 0) + value
