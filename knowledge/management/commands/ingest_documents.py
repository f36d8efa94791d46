"""manage.py ingest_documents <tenant> <dataset> <folder>: ingest every .txt/.md file under a folder."""
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from common.errors import ServiceError
from knowledge import services
from knowledge.models import Dataset
from tenancy.models import Tenant


class Command(BaseCommand):
    help = ("Ingest the .txt and .md files under a folder into a tenant's dataset. A file is identified by its "
            "path relative to the folder: ingesting again updates changed files in place.")

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("dataset", help="the dataset's name")
        parser.add_argument("folder", type=Path)
        parser.add_argument("--create", action="store_true", help="create the dataset when it does not exist")
        parser.add_argument("--batch-size", type=int, default=services.BATCH_SIZE)
        parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                            help="metadata for every document (repeatable), e.g. --metadata department=hr")

    def handle(self, *args, tenant, dataset, folder, create, batch_size, metadata, **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"no tenant {tenant!r}")
        dataset_obj = Dataset.objects.for_tenant(tenant_obj).filter(name=dataset).first()
        if dataset_obj is None:
            if not create:
                raise CommandError(f"tenant {tenant!r} has no dataset {dataset!r} (add --create to create it)")
            dataset_obj = services.dataset_create(tenant=tenant_obj, name=dataset, actor="manage.py")
        if not folder.is_dir():
            raise CommandError(f"{folder} is not a folder")
        extra = {}
        for pair in metadata:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise CommandError(f"--metadata {pair!r}: use KEY=VALUE")
            extra[key] = value
        documents, skipped = [], 0
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in services.TEXT_SUFFIXES)
        for path in files:
            name = path.relative_to(folder).as_posix()
            try:
                size = path.stat().st_size
                if size > services.MAX_UPLOAD_BYTES:
                    raise services.FileRefused(f"{name}: {size:,} bytes is too large; the limit is "
                                               f"{services.MAX_UPLOAD_BYTES:,} bytes")
                doc = services.document_from_file(name, path.read_bytes())
            except services.FileRefused as exc:
                self.stderr.write(f"skipped {exc}")
                skipped += 1
                continue
            documents.append({**doc, "metadata": dict(extra)})
        if not documents:
            raise CommandError(f"no ingestible .txt or .md files under {folder} ({skipped} skipped)")
        self.stdout.write(f"ingesting {len(documents)} documents into {tenant}/{dataset} "
                          f"in batches of {batch_size}")

        def progress(done, total):
            self.stdout.write(f"  {done}/{total} documents ({100 * done // total}%)")
            self.stdout.flush()

        try:
            result = services.documents_ingest_bulk(tenant=tenant_obj, dataset=dataset_obj, documents=documents,
                                                    actor="manage.py", batch_size=max(1, batch_size),
                                                    progress=progress)
        except ServiceError as exc:
            raise CommandError(f"nothing was ingested: {exc.detail}") from exc
        summary = result.summary
        self.stdout.write(self.style.SUCCESS(
            f"done: {summary['created']} created, {summary['updated']} updated, {summary['unchanged']} unchanged"
            + (f", {skipped} skipped" if skipped else "")))
