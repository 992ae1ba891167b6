# One image for both the admin (web) and the worker (qcluster).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY project ./project
COPY canonical_ids ./canonical_ids
COPY jobs ./jobs
COPY inbound_email ./inbound_email
COPY notifications ./notifications
COPY ops ./ops
COPY processes ./processes
COPY manage.py ./
RUN pip install . && useradd --create-home --uid 1000 worker && mkdir -p /app/var \
    && chown worker /app/var
USER worker

# DEBUG=false here: SECRET_KEY must come from the env file. collectstatic needs settings
# that load, so it gets a throwaway random key that no running container ever holds;
# WhiteNoise serves what it collects (issue 19).
ENV DEBUG=false
RUN SECRET_KEY="$(python -m project.secret_key generate)" python manage.py collectstatic --no-input

EXPOSE 8000
CMD ["python", "manage.py", "qcluster"]
