"""The floor: the least an API-key-authenticated write can cost on this stack.

A bare DRF view with the product's API-key authentication and scope check that parses the JSON
body and inserts one row (into a table the benchmark creates itself), then answers with the id.
A governed call does all of this and more: the benchmark reports the difference as ratios.
"""
import json

from bench_schema import FLOOR_TABLE
from django.db import connection
from django.utils import timezone
from rest_framework.response import Response
from rest_framework.views import APIView

from tenancy.entry.authentication import ApiKeyAuthentication
from tenancy.models import Scope
from tenancy.permissions import HasTenant


class FloorView(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [HasTenant]
    required_scope = Scope.AGENT

    def post(self, request):
        body = json.dumps(request.data)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {FLOOR_TABLE} (tenant_id, body, at) VALUES (%s, %s, %s)",  # noqa: S608
                [request.tenant.pk, body, timezone.now().isoformat()],
            )
            row_id = cursor.lastrowid
        return Response({"id": row_id}, status=201)
