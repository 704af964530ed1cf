"""The worst case: the fewest stored-bit flips that bring a model's metric to a target."""

from bitfault.campaign.search.search import DIRECTIONS, SearchModel, SearchResult, worst_case
from bitfault.campaign.search.state import Flip, SearchedTensor

__all__ = ["DIRECTIONS", "Flip", "SearchModel", "SearchResult", "SearchedTensor", "worst_case"]
