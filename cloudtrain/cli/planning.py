"""Commands that say what can run and what it costs: recipes, catalog, estimate, cost-report,
check, init.

Imports the terminal helpers and the shared options of this package; recipes, catalog,
estimate, ledger, check and the job template when a command runs."""

from __future__ import annotations

import shlex
import sys

import click

from .. import catalog_views, completion, config, errors
from ..market import Market
from .options import WIDE, given, region_name, since_age
from .terminal import (colored, confirm_text, job_store, settings_whatever_config_says,
                       table_width)


@click.command()
@click.argument("name", required=False, shell_complete=completion.recipes)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@WIDE
def recipes(name: str | None, as_json: bool, wide: bool) -> None:
    """List the bundled recipes, or show one recipe's arguments and sources.

    \b
    Examples:
      cloudtrain recipes
      cloudtrain recipes resnet9
      cloudtrain recipes resnet9 --json
    """
    from .. import recipes as recipes_module

    if name is not None:
        recipe = recipes_module.load(name)
        click.echo(catalog_views.recipe_json(recipe) if as_json else
                   catalog_views.recipe_detail(recipe, width=table_width(wide)))
        return
    found, broken = recipes_module.survey()
    if as_json:
        click.echo(catalog_views.recipes_json(found))
        return
    click.echo(catalog_views.recipes_table(found, width=table_width(wide)))
    if broken:
        click.echo("\nbroken (fix or remove them):\n" + "\n".join(f"  {exc.message}"
                                                               for exc in broken))


@click.command()
@click.option("--gpu", callback=given,
              help="Only types with this GPU (V100, A100, H100, A10G, T4, L4, ...).")
@click.option("--region", callback=region_name, help="Prices of this region (default: "
              f"{config.REGION_DEFAULT}).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--refresh", is_flag=True, help="Fetch the region's on-demand and gp3 prices from "
              "the AWS price list and its spot prices from EC2 (kept under $CLOUDTRAIN_HOME).")
@WIDE
def catalog(gpu: str | None, region: str, as_json: bool, refresh: bool, wide: bool) -> None:
    """AWS GPU instance types with on-demand and spot prices per hour (bundled snapshot).

    \b
    Examples:
      cloudtrain catalog --gpu A100
      cloudtrain catalog --region eu-west-1 --json
      cloudtrain catalog --refresh --region us-east-1
    """
    from .. import catalog as catalog_module, providers

    # --region, else the region launch resolves (config.yaml, AWS_REGION, AWS_DEFAULT_REGION,
    # the AWS profile), else us-east-1: the same for every command
    region = region or providers.get("aws").account.region()
    if refresh:
        account = providers.get("aws").account
        click.echo(account.refresh_list_prices(region), err=True)
        click.echo(account.refresh_spot(region), err=True)

    unpriced = catalog_module.no_prices(region)
    if unpriced is not None:  # exit 2 with the error, as estimate does
        raise unpriced
    types = catalog_module.matching(gpu, None, region)
    if as_json:
        click.echo(catalog_views.catalog_json(types, region, catalog_module.SNAPSHOT,
                                       catalog_module.on_demand_source(region),
                                       catalog_module.spot_source(region)))
    else:
        click.echo(catalog_views.catalog_table(types, region, width=table_width(wide)))
        click.echo(catalog_views.catalog_sources(region, catalog_module.on_demand_source(region),
                                          catalog_module.spot_source(region),
                                          width=table_width(wide)))


@click.command()
@click.option("--recipe", "-r", required=True, metavar="NAME", shell_complete=completion.recipes,
              help="A bundled recipe.")
@click.option("--profile", "-p", metavar="NAME", callback=given,
              shell_complete=completion.profiles, help="A recipe profile.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              shell_complete=completion.set_keys, help="A recipe argument.")
@click.option("--instance", "-i", "types", multiple=True, metavar="TYPE", callback=given,
              shell_complete=completion.instance_types,
              help="Only these instance types (repeatable).")
@click.option("--gpus", metavar="GPU:N", callback=given, shell_complete=completion.gpus,
              help="Only types with N of this GPU, e.g. A10G:1 or A100:8.")
@click.option("--spot", is_flag=True, help="Mark the cheapest by spot price.")
@click.option("--region", callback=region_name,
              help=f"Prices of this region (default: {config.REGION_DEFAULT}).")
@click.option("--disk-gb", type=click.IntRange(min=8, max=config.GP3_MAX_GB),
              help="Root volume (default: the recipe's).")
@click.option("--nodes", type=int, metavar="N", help="Instances per run (default: the "
              "machines the recipe variant was published on).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@WIDE
def estimate(recipe, profile, sets, types, gpus, spot, region, disk_gb, nodes, as_json,
             wide) -> None:
    """Expected time and cost per run of a recipe on each instance type, before launching.

    \b
    Examples:
      cloudtrain estimate --recipe resnet9
      cloudtrain estimate --recipe airbench94 --gpus A10G:1 --spot
      cloudtrain estimate --recipe resnet9 -i p3.2xlarge -i g5.xlarge
      cloudtrain estimate -r imagenet --set variant=machines-16 -i p3.16xlarge
    """
    from .. import estimate as estimate_module

    with job_store() as store:
        est = estimate_module.for_recipe(recipe, profile, sets, region,
                                         market=Market.SPOT if spot else Market.ON_DEMAND,
                                         types=list(types), gpu_request=gpus, disk_gb=disk_gb,
                                         store=store, nodes=nodes)
    if as_json:
        import dataclasses
        import json

        click.echo(json.dumps(dataclasses.asdict(est), indent=1))
    else:
        click.echo(catalog_views.estimate_table(est, width=table_width(wide)))


@click.command("cost-report")
@click.option("--since", metavar="AGE", callback=since_age,
              help="Only jobs created in this period: 30d, 12h, 2w.")
@click.option("--by", type=click.Choice(["job", "recipe", "instance", "day", "month"]),
              default="job", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
@click.option("--refresh", is_flag=True, help="Settle estimates first (asks EC2 for termination "
              "times and spot price history), and bring running jobs up to date as `status` "
              "does (the instances AWS Auto Scaling put in place of lost ones, read from the "
              "job store).")
@WIDE
def cost_report(since: str | None, by: str, as_json: bool, as_csv: bool, refresh: bool,
                wide: bool) -> None:
    """What jobs cost: per job, recipe, instance, day or month, with totals. Offline.

    \b
    Examples:
      cloudtrain cost-report --since 30d
      cloudtrain cost-report --by recipe --csv
    """
    from .. import ledger
    from ..lifecycle import collect

    with job_store() as store:
        if refresh:
            active = store.jobs(active_only=True)
            if active:
                from ..lifecycle.watch import refresh_active

                refresh_active(store, settings_whatever_config_says(), active)
            collect.settle_all(store)
        rows, total = ledger.report(store, by, since)
    if as_json:
        click.echo(ledger.report_json(rows, total, by))
    elif as_csv:
        click.echo(ledger.report_csv(rows, total, by), nl=False)
    else:
        click.echo(catalog_views.cost_report(rows, total, by, width=table_width(wide)))


@click.command()
@click.option("--region", callback=region_name, help="Check this region (default: "
              f"{config.REGION_DEFAULT}).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@WIDE
@click.option("--launch", is_flag=True, help="Also launch once, for real and small: a t3.micro "
              "runs a tiny job through the whole path (key pair, security group, AMI, "
              "RunInstances, SSH, sync, agent, job store, collection), then everything is "
              "terminated and the bill shown (a cent or less).")
@click.option("--gpu", is_flag=True, help="With --launch: on the region's cheapest GPU type "
              "instead (g4dn.xlarge: a few cents).")
@click.option("--recovery", is_flag=True, help="With --launch: prove spot recovery instead: a "
              "spot t3.micro in an Auto Scaling group, interrupted by AWS Fault Injection "
              "Service, replaced by the group and resumed from its checkpoint (a few cents; "
              "infra/README.md section 2b).")
@click.option("--nodes", type=int, metavar="N", help="With --launch: prove a job on N nodes "
              "(2 to 4) instead: N c6a.large in one cluster placement group meet at the "
              "rendezvous and on a second port (a cent or so).")
@click.option("--yes", "-y", is_flag=True, help="With --launch: do not ask before launching.")
def check(region: str | None, as_json: bool, wide: bool, launch: bool, gpu: bool,
          recovery: bool, nodes: int | None, yes: bool) -> None:
    """Every setting and where it came from, and whether AWS is ready: credentials, account,
    region, Deep Learning AMI, GPU quotas for the recipes' instance types. Exit code 1 when
    a launch would fail. With --launch, one real launch, each step on one line with its
    time and verdict; a failure names the permission, quota or setting that is missing.

    \b
    Examples:
      cloudtrain check
      cloudtrain check --region eu-west-1 --json
      cloudtrain check --launch
      cloudtrain check --launch --gpu --region us-west-2
      cloudtrain check --launch --recovery
      cloudtrain check --launch --nodes 2
    """
    chosen = [f for f, on in (("--gpu", gpu), ("--recovery", recovery),
                              (f"--nodes {nodes}", nodes is not None)) if on]
    flag = chosen[0] if chosen else "--yes"
    if (chosen or yes) and not launch:
        raise errors.UsageError(f"{flag.split()[0]} applies to --launch",
                                hint=f"cloudtrain check --launch{'' if yes else ' ' + flag}")
    if len(chosen) > 1:
        raise errors.UsageError(f"{' and '.join(f.split()[0] for f in chosen)} are separate "
                                "checks: run one, then the other",
                                hint=f"cloudtrain check --launch {chosen[-1]}")
    if launch:
        from .. import launch_check, launch_check_nodes, launch_check_recovery

        say = None if as_json else lambda step: click.echo(launch_check.render_step(step))
        ask = None if yes else confirm_text
        if recovery:
            report = launch_check_recovery.run(region=region, say=say, confirm=ask)
        elif nodes is not None:
            report = launch_check_nodes.run(nodes, region=region, say=say, confirm=ask)
        else:
            report = launch_check.run(region=region, gpu=gpu, confirm=ask, say=say)
        click.echo(launch_check.to_json(report) if as_json else launch_check.render_end(report))
        sys.exit(launch_check.exit_code(report))
    from .. import check as checks

    checked = checks.run(region=region)
    click.echo(checks.to_json(checked) if as_json else
               checks.render(checked, width=table_width(wide), color=colored()))
    sys.exit(checks.exit_code(checked))


@click.command()
@click.option("--recipe", "-r", metavar="NAME", shell_complete=completion.recipes,
              help="A job file for this bundled recipe "
              "(default: for your own code).")
@click.option("--output", "-o", "path", default="cloudtrain.yaml", show_default=True,
              metavar="FILE", help="Where to write it (- prints it).")
@click.option("--force", is_flag=True, help="Replace the file if it exists.")
def init(recipe: str | None, path: str, force: bool) -> None:
    """Write a commented job file to edit and run with `cloudtrain launch FILE`.

    \b
    Examples:
      cloudtrain init
      cloudtrain init --recipe resnet9 -o resnet9.yaml
    """
    from ..job_template import write_example

    text = write_example(path, recipe, force)
    if text:
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {path}: edit it, then `cloudtrain launch {shlex.quote(path)}` "
                   f"(--dry-run shows the plan and its price)")
