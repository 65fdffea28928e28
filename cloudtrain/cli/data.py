"""`cloudtrain data`: datasets prepared, pushed to S3 and listed.

Imports the terminal helpers and the shared options of this package; dataprep, datasets,
the providers and rich when a command runs."""

from __future__ import annotations

import contextlib

import click

from .. import catalog_views, config
from .options import WIDE, region_name
from .terminal import job_store, table_width


@click.group()
def data() -> None:
    """Datasets: turn the official archives into the layout the recipes read, and upload it.

    \b
    Examples:
      cloudtrain data prepare imagenet ~/ILSVRC2012 /data/imagenet
      cloudtrain data push /data/imagenet s3://my-bucket/imagenet
      cloudtrain data ls
    """


@data.command("ls")
@click.option("--check", is_flag=True, help="Read each S3 dataset's manifest (or listing) now "
              "for its size, with your AWS credentials.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@WIDE
def data_ls(check, as_json, wide) -> None:
    """List the datasets declared in config.yaml: source, size, and where each was last staged."""
    from .. import datasets, providers

    settings = config.Settings.load()
    with job_store() as store:
        account = providers.get("aws", settings).account if check else None
        rows = datasets.listing(store, settings, account)
    click.echo(catalog_views.datasets_json(rows) if as_json else
               catalog_views.datasets_table(rows, width=table_width(wide)))


@data.command("prepare")
@click.argument("dataset", metavar="DATASET")
@click.argument("src", type=click.Path(file_okay=False, path_type=str))
@click.argument("dest", type=click.Path(file_okay=False, path_type=str))
@click.option("--sizes", default="160,352", show_default=True, metavar="N,N",
              help="Also write copies with the shorter side resized to each N ('' for none).")
@click.option("--max-sides", default="", metavar="N,N",
              help="Also write FFCV's copies: the longer side at most N (OpenCV INTER_AREA, "
                   "needs opencv-python-headless), every image a JPEG at --quality, in "
                   "max/<N>/. 500 is FFCV's (write_imagenet.sh 500 0.50 90); the ffcv-rn50-* "
                   "variants read max/500 when it is there.")
@click.option("--quality", type=click.IntRange(1, 100), default=90, show_default=True,
              help="JPEG quality of the resized copies (full-size files are linked, not "
                   "re-encoded).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes (default: one per CPU).")
@click.option("--blacklist", metavar="FILE", help="The devkit's "
              "ILSVRC2012_validation_blacklist.txt: leave those validation images out.")
@click.option("--labels", metavar="FILE", help="Validation labels for a flat val/ folder: "
              "LOC_val_solution.csv or '<image> <wnid>' lines (default: SRC/LOC_val_solution.csv).")
def data_prepare(dataset, src, dest, sizes, max_sides, quality, workers, blacklist,
                 labels) -> None:
    """Prepare DATASET from its extracted archives in SRC into DEST (resumable).

    For imagenet, SRC holds train/<wnid>/ (or the per-class train/<wnid>.tar files) and val/
    (flat with LOC_val_solution.csv, or sorted by wnid). DEST gets train/<wnid>/ and
    val/<wnid>/ at full size plus sz/<N>/train and sz/<N>/val for each --sizes N, and
    max/<N>/train and max/<N>/val for each --max-sides N. Run it again after an interruption
    (or with more sizes): it writes only what is missing.

    FFCV's writer stores half of its images as raw pixels; --max-sides stores them all as
    JPEGs. Measured on 200 generated 500x375-class images (2-core EPYC, Pillow with
    libjpeg-turbo; benchmarks/imagenet_pipeline.py --only ffcv): a q90 JPEG is 106 KB against
    575 KB of raw pixels, and decodes in 2.7 ms against 0.1 ms to read the raw ones. FFCV's
    half-raw mix would be 3.2x the disk, the upload and the staging of all-JPEG, to save
    about half the CPU decode time; decode=dali decodes the JPEGs on the GPU instead (nvJPEG),
    and the PIL and DALI loaders read JPEG files as they are.

    \b
    Examples:
      cloudtrain data prepare imagenet ~/ILSVRC2012 /data/imagenet
      cloudtrain data prepare imagenet ~/ILSVRC2012 /data/imagenet --sizes 160 \\
          --blacklist ~/devkit/data/ILSVRC2012_validation_blacklist.txt
      cloudtrain data prepare imagenet ~/ILSVRC2012 /data/imagenet --max-sides 500
    """
    from .. import dataprep

    with progress_bars() as progress:
        report = dataprep.prepare(dataset, src, dest, sizes=dataprep.parse_sizes(sizes),
                                  quality=quality, workers=workers, blacklist=blacklist,
                                  labels=labels, progress=progress,
                                  max_sides=dataprep.parse_sizes(max_sides, "--max-sides",
                                                                 "500"))
    click.echo(catalog_views.prepare_report(report))



@data.command("push")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=str))
@click.argument("url", metavar="s3://BUCKET/PREFIX")
@click.option("--shard-mb", type=int, default=256, show_default=True,
              help="Target size of each tar shard (a larger file is a shard of its own).")
@click.option("--workers", type=int, default=8, show_default=True,
              help="Shards made and uploaded at a time (each a temporary file while it goes).")
@click.option("--region", callback=region_name, help="The bucket's AWS region (default: "
              f"{config.REGION_DEFAULT}).")
def data_push(directory, url, shard_mb, workers, region) -> None:
    """Upload the prepared tree DIR to S3 as tar shards plus a manifest (resumable).

    Shards go to PREFIX/shards/shard-NNNNN.tar, each with its sha256, and PREFIX/manifest.json
    is written last: its presence means the dataset is complete. Run it again after an
    interruption, or after changing the tree: shards already stored with the same sha256 are
    not uploaded again. Hidden files and folders (.prepare/) are left out.

    \b
    Example:
      cloudtrain data push /data/imagenet s3://my-bucket/imagenet
    """
    from .. import datasets, providers

    with progress_bars() as progress:
        root, bucket, prefix = datasets.check_push(directory, url, shard_mb, workers, region)
        report = providers.get("aws").account.push_dataset(
            root, bucket, prefix, shard_mb=shard_mb, workers=workers, region=region,
            progress=progress)
    click.echo(catalog_views.push_report(report))


@contextlib.contextmanager
def progress_bars():
    """A `progress(done, total, stage)` callback drawing one rich bar per stage on stderr when
    it is a terminal (drawn from the caller's thread: no refresh thread beside worker forks)."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID,
                               TimeRemainingColumn)

    console = Console(stderr=True)
    bars = Progress("{task.description}", BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), console=console, auto_refresh=False,
                    disable=not console.is_terminal)
    tasks: dict[str, TaskID] = {}

    def progress(done: int, total: int, stage: str) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total)
        bars.update(tasks[stage], completed=done, total=total, refresh=True)

    with bars:
        yield progress
