"""WikiText-103 from its standard files: ``wiki.{train,valid,test}.raw`` (wikitext-103-raw-v1)
or the tokenized ``wiki.{train,valid,test}.tokens``; the splits are the files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .config import PATH_FORMATS
from .sources import SPLITS, Chunk, CorpusSource
from .textio import iter_text_blocks

LAYOUTS = ("raw", "tokens")
"""File suffixes tried in order; the raw layout wins when both are complete."""


class WikiTextSource(CorpusSource):
    """The three WikiText-103 split files of a folder, streamed as UTF-8 text."""

    def __init__(self, path: str | Path, max_train_bytes: int | None = None) -> None:
        super().__init__("wikitext103", max_train_bytes)
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(
                f"corpus 'wikitext103': {folder} is not a folder; expected "
                f"{PATH_FORMATS['wikitext103']}"
            )
        for layout in LAYOUTS:
            paths = {split: folder / f"wiki.{split}.{layout}" for split in SPLITS}
            if all(p.is_file() for p in paths.values()):
                self.paths = paths
                return
        missing = [p.name for p in (folder / f"wiki.{s}.raw" for s in SPLITS) if not p.is_file()]
        raise FileNotFoundError(
            f"corpus 'wikitext103': {folder} lacks {missing}; "
            f"expected {PATH_FORMATS['wikitext103']}"
        )

    def files(self) -> list[Path]:
        return [self.paths[split] for split in SPLITS]

    def _read(self, split: str) -> Iterator[Chunk]:
        path = self.paths[split]
        with open(path, "rb") as fh:
            yield from iter_text_blocks(fh, 0, path.stat().st_size, str(path))
